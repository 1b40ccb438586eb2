// Command kvmesh is the kvmesh command line: cluster status, the ring and
// the models, put/get/lookup/delete of entries from files, tokens, gossip
// keys and settings, a local cluster of kvmeshd processes to try things
// out. The in-process demo is cmd/kvmesh-demo. `kvmesh help` lists the
// commands, `kvmesh help CMD` (or `kvmesh CMD -h`) explains one.
//
// Global flags (-addr, -format, -timeout, TLS and token) go before or
// after the command name. Exit codes: 0 ok, 1 error, 2 usage. Keys print
// and parse as FINGERPRINT/CONTENT/CONTEXT (chunk.Key.String).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvmesh/kvmesh/daemon"
)

const usage = `usage: kvmesh [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]

commands:
  status                  members and their state, leader, epoch, settings, each node's tiers
  ring                    ring members and their share of a sample of content IDs
  models                  registered models
  register FILE           register a model from its config.json or a register JSON (docs/KEYS.md);
                          prints its fingerprint
  encode -spec F -kv F -o F
                          build an entry file from K/V tensors in a safetensors file (offline)
  put ENTRY...            store encoded entries (kvmesh encode, chunk.Encode output) from files
  get KEY                 read an entry (whole, or the decoded K/V of a range)
  lookup -model FP CONTENT...
                          EXACT / APPROXIMATE / MISS per content ID
  delete KEY              delete an entry from its replicas
  drain NODE              copy a node's chunks to their other owners, then the node leaves
  token create|list|revoke
                          API tokens (admin)
  gossip-key new|list|install|use|remove
                          gossip keyring files and live key rotation (admin)
  settings get|set        the cluster settings: R, W, codec (admin)
  certs                   make a CA and node/client certificates (docs/SECURITY.md)
  local-cluster N         start N kvmeshd processes on this machine (Ctrl-C stops them)
  version                 this build: version, commit, Go version
  help [COMMAND]          this text, or a command's

global flags (before or after the command):
  -addr HOST:PORT[,...]   any cluster members; each gets -connect-timeout (3s) to answer
  -format text|json       output format; json field names are stable
  -timeout D              deadline of the command (30s; drain is not bounded by it)
  -ca F -cert F -key F    mutual TLS (kvmesh certs -client NAME makes them)
  -server-name N          name checked in node certificates instead of the dialed host
  -token T                API token; -insecure allows it without TLS

environment:
  KVMESH_ADDR             default of -addr
  KVMESH_TOKEN            default of -token
  KVMESH_CA, KVMESH_CERT, KVMESH_KEY
                          defaults of -ca, -cert, -key

exit codes: 0 ok, 1 error (refused, unreachable, no quorum), 2 usage (unknown command or flag,
missing or stray argument)
`

// command is one subcommand of kvmesh.
type command struct {
	name, args, help string
	run              func(ctx context.Context, e *env, args []string) error
}

// commands lists kvmesh's subcommands in help order.
func commands() []command {
	return []command{
		{"status", "", "Members, leader, epoch, settings and each node's tiers. STATE is what each member reports: ready, recovering (metadata catching up or startup pull running), joining (no leader known, or not in the ring yet), left (drained), or unreachable; -format json adds state_reason. Exits 1 when the cluster has no leader (no quorum) or a member does not answer.", statusCmd},
		{"ring", "", "Ring members, each one's state (as in status) and their share of 100000 sample content IDs (primary and any replica). A member whose own ring differs from the leader's at the same epoch (damaged Raft state) is recovering, and the line after the table says how.", ringCmd},
		{"models", "", "Registered models.", modelsCmd},
		{"register", "[-revision R] [-tokenizer T] [-dtype D] [-salt S] [-dry-run] FILE", registerUsage, registerCmd},
		{"encode", "-spec FILE -kv FILE [-tokens FILE] [-context C] [-codec C] -o FILE", encodeUsage, encodeCmd},
		{"put", "ENTRY...", "Store encoded entries (kvmesh encode, chunk.Encode output) from files.", putCmd},
		{"get", "[-o FILE] [-layers A:B] [-heads A:B] KEY", "Read an entry: the whole blob, or with -layers/-heads the decoded K/V of a range (layout [layer][K|V][token][head][dim]). Writes bytes, never JSON.", getCmd},
		{"lookup", "-model FP [-want CONTEXT] CONTENT...", "EXACT / APPROXIMATE / MISS per content ID, with the key found and its holders.", lookupCmd},
		{"delete", "KEY", "Delete an entry from its replicas.", deleteCmd},
		{"drain", "[-keep] NODE", "Copy a node's chunks to their other owners, then the node leaves the cluster (NODE: member ID or gRPC address). Not bounded by -timeout.", drainCmd},
		{"token", "create|list|revoke ...", tokenUsage, tokenCmd},
		{"gossip-key", "new|list|install|use|remove ...", gossipKeyUsage, gossipKeyCmd},
		{"settings", "[get] | set [-r R] [-w W] [-codec C] [-if-version V]", settingsUsage, settingsCmd},
		{"certs", "[-dir D] [-node NAME=HOST,...]... [-client NAME]...", "Make a CA (first run) and node/client certificates (docs/SECURITY.md).", certsCmd},
		{"local-cluster", "[-dir D] [-kvmeshd PATH] [-dram SIZE] N", "Start N kvmeshd processes on this machine (plaintext, for trying out); Ctrl-C stops them.", localClusterCmd},
		{"version", "", "This build: module version, commit, Go version.", versionCmd},
	}
}

// findCommand returns the command called name.
func findCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// printHelp prints a command's help: its usage line, what it does, and
// its flags (the global ones included).
func printHelp(w io.Writer, name string, fs *flag.FlagSet) {
	top, _, _ := strings.Cut(name, " ")
	if c, ok := findCommand(top); ok {
		if strings.HasPrefix(c.help, "usage:") {
			fmt.Fprintln(w, c.help)
		} else {
			fmt.Fprintf(w, "usage: kvmesh %s %s\n\n%s\n", c.name, c.args, c.help)
		}
	}
	if fs != nil {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	fmt.Fprintln(w, "\nenvironment: KVMESH_ADDR, KVMESH_TOKEN, KVMESH_CA, KVMESH_CERT, KVMESH_KEY; exit codes: 0 ok, 1 error, 2 usage")
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	code := exitCode(err)
	if code != exitOK {
		fmt.Fprintln(os.Stderr, "kvmesh:", err)
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "run 'kvmesh help' for usage")
		}
	}
	os.Exit(code)
}

// run is kvmesh with args, reading the environment; the exit status is
// exitCode of its error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, os.Getenv, stdout, stderr)
}

func runEnv(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := &env{g: defaultGlobals(getenv), stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("kvmesh", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.g.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return flag.ErrHelp
		}
		return usagef("%v", err)
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command")
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	switch name {
	case "kvmeshd": // local-cluster runs itself as the daemon when no kvmeshd binary is at hand
		return daemon.Run(ctx, rest, stdout, stderr)
	case "help":
		if len(rest) == 0 {
			fmt.Fprint(stdout, usage)
			return nil
		}
		if _, ok := findCommand(rest[0]); !ok || len(rest) > 1 {
			return usagef("help: unknown command %q", strings.Join(rest, " "))
		}
		// The command's own -h prints its flags too.
		return ignoreHelp(runEnv(ctx, append(rest[:1:1], "-h"), getenv, stdout, stderr))
	}
	c, ok := findCommand(name)
	if !ok {
		return usagef("unknown command %q", name)
	}
	return c.run(ctx, e, rest)
}

// ignoreHelp maps flag.ErrHelp to success.
func ignoreHelp(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}
