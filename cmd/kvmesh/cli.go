package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/daemon"
)

// Exit codes of kvmesh.
const (
	exitOK    = 0 // the command did what it says
	exitError = 1 // it failed (the cluster refused, a node is down, no quorum, a file is missing)
	exitUsage = 2 // the command line is wrong: unknown command or flag, missing or stray argument
)

// usageError is a wrong command line: kvmesh prints it with the
// command's usage and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCode maps run's error to the process's exit status.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	}
	// `kvmesh kvmeshd` exits as kvmeshd does.
	if c := daemon.ExitCode(err); c != daemon.ExitError {
		return c
	}
	return exitError
}

// globals are the flags every command takes, before or after its name.
type globals struct {
	addr           string
	timeout        time.Duration
	connectTimeout time.Duration
	format         string
	sec            secFlags
}

// env is what a command runs with: the global flags and the outputs.
type env struct {
	g              globals
	stdout, stderr io.Writer
}

// register adds the global flags to fs with their current values as
// defaults, so a flag given before the command name survives the
// command's own flag set.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.addr, "addr", g.addr, "gRPC address(es) of any cluster member, comma-separated ($KVMESH_ADDR)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "deadline of the command")
	fs.DurationVar(&g.connectTimeout, "connect-timeout", g.connectTimeout, "how long each address of -addr may take to answer before the next is tried")
	fs.StringVar(&g.format, "format", g.format, "output format: text or json")
	g.sec.register(fs)
}

// defaultGlobals reads the environment.
func defaultGlobals(getenv func(string) string) globals {
	return globals{
		addr: getenv("KVMESH_ADDR"), timeout: 30 * time.Second, connectTimeout: 3 * time.Second, format: "text",
		sec: secFlags{token: getenv("KVMESH_TOKEN")}.withFiles(getenv("KVMESH_CA"), getenv("KVMESH_CERT"), getenv("KVMESH_KEY")),
	}
}

// flags is a flag set for the command `name` (as in "token create") with
// the global flags; its -h prints the command's help.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.g.register(fs)
	return fs
}

// parse parses args with fs and returns the positional arguments: -h
// prints the command's help (exit 0); a bad flag or a count of
// arguments outside [minArgs, maxArgs] (maxArgs < 0: any) is a usage
// error. Flags may come before, between and after the arguments.
func (e *env) parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printHelp(e.stdout, fs.Name(), fs)
				return nil, flag.ErrHelp
			}
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch {
	case len(pos) < minArgs:
		return nil, usagef("%s: missing argument\n%s", fs.Name(), usageLine(fs.Name()))
	case maxArgs >= 0 && len(pos) > maxArgs:
		return nil, usagef("%s: unexpected argument %q\n%s", fs.Name(), pos[maxArgs], usageLine(fs.Name()))
	}
	if e.g.format != "text" && e.g.format != "json" {
		return nil, usagef("-format %q: want text or json", e.g.format)
	}
	return pos, nil
}

// json reports whether the command prints JSON.
func (e *env) json() bool { return e.g.format == "json" }

// print writes v as JSON with -format json, else calls text.
func (e *env) print(v any, text func(w io.Writer) error) error {
	if e.json() {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return text(e.stdout)
}

// seeds is -addr split, or an error saying how to set it.
func (e *env) seeds() ([]string, error) {
	var out []string
	for _, a := range strings.Split(e.g.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cluster address: give -addr HOST:PORT or set KVMESH_ADDR")
	}
	return out, nil
}

// client connects to the cluster: the first address of -addr that
// answers within -connect-timeout is asked for the ring.
func (e *env) client(ctx context.Context) (*client.Client, error) {
	seeds, err := e.seeds()
	if err != nil {
		return nil, err
	}
	first, err := e.firstAnswering(ctx, seeds)
	if err != nil {
		return nil, err
	}
	order := []string{first}
	for _, s := range seeds {
		if s != first {
			order = append(order, s)
		}
	}
	c, err := client.New(ctx, e.g.sec.config(client.Config{Seeds: order}))
	if err != nil {
		return nil, plain("connect", err)
	}
	return c, nil
}

// firstAnswering returns the first seed that answers ClusterInfo within
// -connect-timeout; if none does, an error naming each one's failure.
func (e *env) firstAnswering(ctx context.Context, seeds []string) (string, error) {
	opts, err := client.DialOptions(e.g.sec.config(client.Config{}))
	if err != nil {
		return "", err
	}
	var fails []string
	var last error
	for _, s := range seeds {
		err := func() error {
			cc, err := grpc.NewClient(s, opts...)
			if err != nil {
				return err
			}
			defer cc.Close()
			cctx, cancel := context.WithTimeout(ctx, e.g.connectTimeout)
			defer cancel()
			_, err = api.NewClientClient(cc).ClusterInfo(cctx, &api.ClusterInfoRequest{})
			return err
		}()
		if err == nil {
			return s, nil
		}
		last = err
		fails = append(fails, s+": "+describe(err))
		if ctx.Err() != nil {
			break
		}
	}
	return "", &plainError{msg: "cannot reach the cluster (" + strings.Join(fails, "; ") + ")", hint: hintFor(last), err: last}
}

// plainError is an error in plain words with a hint; it wraps the
// original error for errors.Is.
type plainError struct {
	msg, hint string
	err       error
}

func (e *plainError) Error() string {
	if e.hint == "" {
		return e.msg
	}
	return e.msg + "\nhint: " + e.hint
}

func (e *plainError) Unwrap() error { return e.err }

// plain rewrites a failed call's error (often a chain of gRPC errors, one
// per replica tried) as what: the first gRPC status in plain words, and a
// hint.
func plain(what string, err error) error {
	if err == nil {
		return nil
	}
	var pe *plainError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return &plainError{msg: what + ": " + describe(err), hint: hintFor(err), err: err}
}

// grpcStatus is the first gRPC status in err's tree.
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus(), true
	}
	return nil, false
}

// describe says what err is in a few words: the gRPC code and message of
// the first status in it, without the transport's internals.
func describe(err error) string {
	if err == nil {
		return "no error"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	st, ok := grpcStatus(err)
	if !ok {
		return err.Error()
	}
	msg := st.Message()
	switch {
	case st.Code() == codes.Unavailable && isTLSMismatch(msg):
		return "Unavailable: the node closed the connection during the handshake"
	case st.Code() == codes.Unavailable && strings.Contains(msg, "connection refused"):
		return "Unavailable: connection refused (no kvmeshd listening there)"
	case st.Code() == codes.Unavailable && strings.Contains(msg, "first record does not look like a TLS handshake"):
		return "Unavailable: the node speaks plaintext, not TLS"
	case st.Code() == codes.DeadlineExceeded:
		return "DeadlineExceeded: no answer in time"
	case st.Code() == codes.NotFound && strings.Contains(msg, "replication: not found"):
		// The message lists every replica's miss; the key is in the
		// command's own words already.
		return "NotFound: no replica holds it (never stored, deleted or evicted)"
	}
	// A transport message repeats the dial's internals; keep its last part.
	if i := strings.LastIndex(msg, ": "); i >= 0 && st.Code() == codes.Unavailable {
		msg = msg[i+2:]
	}
	return st.Code().String() + ": " + msg
}

func isTLSMismatch(msg string) bool {
	return strings.Contains(msg, "error reading server preface") || strings.Contains(msg, "connection reset by peer")
}

// hintFor suggests what to do about err, or "".
func hintFor(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "a node or the network is slow or down; raise -timeout or try another -addr"
	}
	st, ok := grpcStatus(err)
	if !ok {
		return ""
	}
	switch st.Code() {
	case codes.Unavailable:
		if isTLSMismatch(st.Message()) {
			return "the cluster probably requires mutual TLS: give -ca, -cert and -key (or KVMESH_CA, KVMESH_CERT, KVMESH_KEY)"
		}
		if strings.Contains(st.Message(), "TLS handshake") {
			return "the cluster runs without TLS: drop -ca/-cert/-key"
		}
		return "check -addr and that the node is running (kvmesh status against another node shows the members)"
	case codes.Unauthenticated:
		return "give an API token with -token or KVMESH_TOKEN (kvmesh token create)"
	case codes.PermissionDenied:
		return "the token lacks the scope or namespace for this call (kvmesh token list shows its scopes)"
	case codes.NotFound:
		return ""
	case codes.DeadlineExceeded:
		return "a node or the network is slow or down; raise -timeout or try another -addr"
	}
	return ""
}

// withFiles sets the TLS files.
func (s secFlags) withFiles(ca, cert, key string) secFlags {
	s.tls.CAFile, s.tls.CertFile, s.tls.KeyFile = ca, cert, key
	return s
}

// usageLine is "usage: kvmesh CMD ARGS" for the command (or "token
// create"-like subcommand) name.
func usageLine(name string) string {
	top, _, _ := strings.Cut(name, " ")
	c, ok := findCommand(top)
	if !ok || strings.HasPrefix(c.help, "usage:") {
		return "run 'kvmesh help " + top + "'"
	}
	return "usage: kvmesh " + c.name + " " + c.args
}

// connected parses a cluster command's flags, then connects under
// -timeout; done closes the client and the deadline.
func (e *env) connected(ctx context.Context, fs *flag.FlagSet, args []string, minArgs, maxArgs int) (pos []string, c *clientConn, err error) {
	if pos, err = e.parse(fs, args, minArgs, maxArgs); err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, e.g.timeout)
	cl, err := e.client(cctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return pos, &clientConn{Client: cl, ctx: cctx, cancel: cancel}, nil
}

// clientConn is a connected client with the command's deadline.
type clientConn struct {
	*client.Client
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *clientConn) close() {
	_ = c.Client.Close()
	c.cancel()
}
