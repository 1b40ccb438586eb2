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
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/daemon"
	"github.com/kvmesh/kvmesh/internal/buildinfo"
	"github.com/kvmesh/kvmesh/internal/units"
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

// versionOut is `kvmesh version -format json`.
type versionOut = buildinfo.Info

func versionCmd(_ context.Context, e *env, args []string) error {
	if _, err := e.parse(e.flags("version"), args, 0, 0); err != nil {
		return err
	}
	info := buildinfo.Read()
	return e.print(versionOut(info), func(w io.Writer) error {
		_, err := fmt.Fprintln(w, "kvmesh", info)
		return err
	})
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

// statusOut is `kvmesh status -format json`.
type statusOut struct {
	Epoch             uint64       `json:"epoch"`
	Leader            string       `json:"leader"`
	LeaderGRPC        string       `json:"leader_grpc"`
	ReplicationFactor uint32       `json:"replication_factor"`
	WriteQuorum       uint32       `json:"write_quorum"`
	Codec             string       `json:"codec"`
	Nodes             []nodeStatus `json:"nodes"`
}

type nodeStatus struct {
	ID   string `json:"id"`
	GRPC string `json:"grpc"`
	HTTP string `json:"http"`
	Up   bool   `json:"up"`
	// State is what the node reports (api.StateReady, StateRecovering,
	// StateJoining, StateLeft), or "unreachable" when it does not answer;
	// StateReason says why it is not ready.
	State       string       `json:"state"`
	StateReason string       `json:"state_reason,omitempty"`
	Error       string       `json:"error,omitempty"`
	Entries     uint64       `json:"entries"`
	Bytes       uint64       `json:"bytes"`
	Tiers       []tierStatus `json:"tiers"`
}

type tierStatus struct {
	Name          string `json:"name"`
	Entries       uint64 `json:"entries"`
	Bytes         uint64 `json:"bytes"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	Evictions     uint64 `json:"evictions"`
}

// stateUnreachable is the state of a member that does not answer.
const stateUnreachable = "unreachable"

// errNoLeader: the cluster has no leader, so no quorum for writes.
var errNoLeader = errors.New("no leader: the cluster has no quorum (fewer than a majority of its Raft voters are up); metadata writes fail until enough nodes are back")

func statusCmd(ctx context.Context, e *env, args []string) error {
	_, c, err := e.connected(ctx, e.flags("status"), args, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	info, err := c.ClusterInfo(c.ctx)
	if err != nil {
		return plain("status", err)
	}
	out := statusOut{Epoch: info.Epoch, Leader: info.LeaderId, LeaderGRPC: info.LeaderGrpcAddr,
		ReplicationFactor: info.ReplicationFactor, WriteQuorum: info.WriteQuorum, Codec: info.Codec, Nodes: []nodeStatus{}}
	down := 0
	for _, m := range info.Members {
		ns := nodeStatus{ID: m.Id, GRPC: m.GrpcAddr, HTTP: m.HttpAddr, Tiers: []tierStatus{}}
		st, state, err := c.StatsAndState(c.ctx, m.GrpcAddr)
		if err != nil {
			ns.State, ns.Error = stateUnreachable, describe(err)
			down++
		} else {
			ns.State, ns.StateReason = api.SplitState(state)
			ns.Up, ns.Entries, ns.Bytes = true, st.Entries, st.Bytes
			for _, t := range st.Tiers {
				ns.Tiers = append(ns.Tiers, tierStatus{t.Name, t.Entries, t.Bytes, t.CapacityBytes, t.Evictions})
			}
		}
		out.Nodes = append(out.Nodes, ns)
	}
	if err := e.print(out, func(w io.Writer) error { return printStatus(w, out) }); err != nil {
		return err
	}
	switch {
	case out.Leader == "":
		return errNoLeader
	case down > 0:
		return fmt.Errorf("%d of %d members do not answer", down, len(out.Nodes))
	}
	return nil
}

func printStatus(w io.Writer, s statusOut) error {
	leader := s.Leader + " (" + s.LeaderGRPC + ")"
	if s.Leader == "" {
		leader = "NONE (no quorum)"
	}
	fmt.Fprintf(w, "epoch %d  leader %s  replication %d  write quorum %d  codec %s\n\n",
		s.Epoch, leader, s.ReplicationFactor, s.WriteQuorum, s.Codec)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGRPC\tHTTP\tENTRIES\tBYTES\tTIERS")
	for _, n := range s.Nodes {
		if !n.Up {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\tdown: %s\n", n.ID, n.State, n.GRPC, n.HTTP, n.Error)
			continue
		}
		var tiers []string
		for _, t := range n.Tiers {
			tiers = append(tiers, fmt.Sprintf("%s %d entries %s/%s evicted %d", t.Name, t.Entries, units.Bytes(t.Bytes), units.Bytes(t.CapacityBytes), t.Evictions))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, n.State, n.GRPC, n.HTTP, n.Entries, units.Bytes(n.Bytes), strings.Join(tiers, "; "))
	}
	return tw.Flush()
}

// ringOut is `kvmesh ring -format json`.
type ringOut struct {
	Epoch             uint64       `json:"epoch"`
	ReplicationFactor int          `json:"replication_factor"`
	Samples           int          `json:"samples"`
	Members           []ringMember `json:"members"`
}

type ringMember struct {
	ID             string  `json:"id"`
	GRPC           string  `json:"grpc"`
	Raft           string  `json:"raft"`
	Gossip         string  `json:"gossip"`
	Weight         float64 `json:"weight"`
	PrimaryPercent float64 `json:"primary_percent"`
	ReplicaPercent float64 `json:"replica_percent"`
	// State and StateReason are as in status: a member whose own ring
	// differs from the leader's at the same epoch is recovering, and the
	// reason says how the rings differ.
	State       string `json:"state"`
	StateReason string `json:"state_reason,omitempty"`
}

func ringCmd(ctx context.Context, e *env, args []string) error {
	_, c, err := e.connected(ctx, e.flags("ring"), args, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := c.ClusterInfo(c.ctx); err != nil {
		return plain("ring", err)
	}
	r := c.Ring()
	rf := c.ReplicationFactor()
	const samples = 100000
	primary := make(map[string]int)
	replica := make(map[string]int)
	for i := range samples {
		id := chunk.ID{Lo: uint64(i) * 0x9e3779b97f4a7c15, Hi: uint64(i)}
		for j, m := range r.Replicas(id, rf) {
			if j == 0 {
				primary[m.ID]++
			}
			replica[m.ID]++
		}
	}
	out := ringOut{Epoch: r.Epoch(), ReplicationFactor: rf, Samples: samples, Members: []ringMember{}}
	for _, m := range r.Members() {
		rm := ringMember{ID: m.ID, GRPC: m.GRPCAddr, Raft: m.RaftAddr, Gossip: m.GossipAddr, Weight: m.EffectiveWeight(),
			PrimaryPercent: 100 * float64(primary[m.ID]) / samples, ReplicaPercent: 100 * float64(replica[m.ID]) / samples}
		if _, state, err := c.StatsAndState(c.ctx, m.GRPCAddr); err != nil {
			rm.State, rm.StateReason = stateUnreachable, describe(err)
		} else {
			rm.State, rm.StateReason = api.SplitState(state)
		}
		out.Members = append(out.Members, rm)
	}
	return e.print(out, func(w io.Writer) error { return printRing(w, out) })
}

// printRing is `kvmesh ring`'s text: the table, then why each member that
// is not ready is not.
func printRing(w io.Writer, out ringOut) error {
	fmt.Fprintf(w, "epoch %d, %d members, R=%d\n", out.Epoch, len(out.Members), out.ReplicationFactor)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGRPC\tRAFT\tGOSSIP\tWEIGHT\tPRIMARY\tREPLICA")
	for _, m := range out.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%.1f%%\t%.1f%%\n", m.ID, m.State, m.GRPC, m.Raft, m.Gossip, m.Weight, m.PrimaryPercent, m.ReplicaPercent)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range out.Members {
		if m.StateReason != "" {
			fmt.Fprintf(w, "%s: %s: %s\n", m.ID, m.State, m.StateReason)
		}
	}
	return nil
}

// modelOut is one model of `kvmesh models -format json`.
type modelOut struct {
	Fingerprint string  `json:"fingerprint"`
	Family      string  `json:"family"`
	Layers      int     `json:"layers"`
	KVHeads     int     `json:"kv_heads"`
	HeadDim     int     `json:"head_dim"`
	DType       string  `json:"dtype"`
	Rope        string  `json:"rope"`
	RopeTheta   float64 `json:"rope_theta"`
	Tokenizer   string  `json:"tokenizer"`
	Revision    string  `json:"revision"`
}

func modelsCmd(ctx context.Context, e *env, args []string) error {
	_, c, err := e.connected(ctx, e.flags("models"), args, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	specs, err := c.Models(c.ctx)
	if err != nil {
		return plain("models", err)
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Fingerprint().String() < specs[j].Fingerprint().String() })
	out := []modelOut{}
	for _, s := range specs {
		out = append(out, modelOut{s.Fingerprint().String(), s.Family, int(s.Layers), int(s.KVHeads), int(s.HeadDim), fmt.Sprint(s.DType),
			fmt.Sprint(s.RopeStyle), float64(s.RopeTheta), s.TokenizerID, s.WeightsRevision})
	}
	return e.print(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FINGERPRINT\tFAMILY\tLAYERS\tKV HEADS\tHEAD DIM\tDTYPE\tROPE\tTOKENIZER\tREVISION")
		for _, m := range out {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s/%g\t%s\t%s\n", m.Fingerprint, m.Family, m.Layers, m.KVHeads, m.HeadDim, m.DType,
				m.Rope, m.RopeTheta, m.Tokenizer, m.Revision)
		}
		return tw.Flush()
	})
}

// putOut is one stored entry of `kvmesh put -format json`.
// Checksums are 16 hex digits, as chunk prints them.
type putOut struct {
	File     string   `json:"file"`
	Key      string   `json:"key"`
	Bytes    int      `json:"bytes"`
	StoredOn []string `json:"stored_on"`
	Checksum string   `json:"checksum"`
	// AlreadyStored: the cluster keeps another version of the key, whose
	// checksum is KeptChecksum; this file's bytes were dropped.
	AlreadyStored bool   `json:"already_stored"`
	KeptChecksum  string `json:"kept_checksum"`
}

func putCmd(ctx context.Context, e *env, args []string) error {
	files, c, err := e.connected(ctx, e.flags("put"), args, 1, -1)
	if err != nil {
		return err
	}
	defer c.close()
	var out []putOut
	for _, f := range files {
		blob, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		hd, err := chunk.ParseHeader(blob, chunk.Limits{})
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		res, err := c.Put(c.ctx, blob)
		if err != nil {
			return plain("put "+f, err)
		}
		p := putOut{File: f, Key: hd.Key.String(), Bytes: len(blob), StoredOn: res.StoredOn,
			Checksum: fmt.Sprintf("%016x", res.Checksum), AlreadyStored: res.AlreadyStored, KeptChecksum: fmt.Sprintf("%016x", res.Kept)}
		switch {
		case e.json():
		case p.AlreadyStored:
			fmt.Fprintf(e.stdout, "%s %s already stored with checksum %s on %s (this entry, %s, is not kept)\n",
				p.Key, units.Bytes(uint64(p.Bytes)), p.KeptChecksum, strings.Join(p.StoredOn, ","), p.Checksum)
		default:
			fmt.Fprintf(e.stdout, "%s %s stored on %s\n", p.Key, units.Bytes(uint64(p.Bytes)), strings.Join(p.StoredOn, ","))
		}
		out = append(out, p)
	}
	if e.json() {
		return e.print(out, nil)
	}
	return nil
}

func getCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("get")
	out := fs.String("o", "", "output file (default stdout)")
	layers := fs.String("layers", "", "layer range A:B: write the decoded K/V of these layers")
	heads := fs.String("heads", "", "KV head range A:B: write the decoded K/V of these heads")
	pos, c, err := e.connected(ctx, fs, args, 1, 1)
	if err != nil {
		return err
	}
	defer c.close()
	key, err := parseKey(pos[0])
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	var data []byte
	if *layers == "" && *heads == "" {
		if data, err = c.Get(c.ctx, key); err != nil {
			return plain("get "+pos[0], err)
		}
	} else {
		var r chunk.Range
		if r.LayerLo, r.LayerHi, err = parseSpan(*layers); err != nil {
			return &usageError{msg: err.Error()}
		}
		if r.HeadLo, r.HeadHi, err = parseSpan(*heads); err != nil {
			return &usageError{msg: err.Error()}
		}
		res, err := c.GetRange(c.ctx, key, r)
		if err != nil {
			return plain("get "+pos[0], err)
		}
		fmt.Fprintf(e.stderr, "layers [%d,%d) heads [%d,%d) of %d tokens, %v, layout [layer][K|V][token][head][dim]\n",
			res.Range.LayerLo, res.Range.LayerHi, res.Range.HeadLo, res.Range.HeadHi, res.Shape.Tokens, res.Shape.DType)
		data = res.Data
	}
	if *out == "" {
		_, err = e.stdout.Write(data)
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}

// lookupOut is one content ID of `kvmesh lookup -format json`.
type lookupOut struct {
	Content string   `json:"content"`
	Result  string   `json:"result"`
	Key     string   `json:"key,omitempty"`
	Holders []string `json:"holders"`
}

func lookupCmd(ctx context.Context, e *env, args []string) error {
	fs := e.flags("lookup")
	model := fs.String("model", "", "model fingerprint (required)")
	want := fs.String("want", "standalone", "context wanted: standalone, window(W):ID or prefix:ID")
	pos, err := e.parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	fp, err := parseFingerprint(*model)
	if err != nil {
		return usagef("-model: %v", err)
	}
	wc, err := parseContext(*want)
	if err != nil {
		return usagef("-want: %v", err)
	}
	var items []client.LookupItem
	for _, a := range pos {
		id, err := parseID(a)
		if err != nil {
			return usagef("%v", err)
		}
		items = append(items, client.LookupItem{Content: id, Want: wc})
	}
	_, c, err := e.connected(ctx, e.flags("lookup"), nil, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	res, err := c.Lookup(c.ctx, fp, items)
	if err != nil {
		return plain("lookup", err)
	}
	out := []lookupOut{}
	for i, r := range res {
		lo := lookupOut{Content: items[i].Content.String(), Result: strings.ToUpper(r.Match.String()), Holders: []string{}}
		if r.Match != chunk.MatchMiss {
			lo.Key = r.Key.String()
		}
		for _, h := range r.Holders {
			lo.Holders = append(lo.Holders, h.ID)
		}
		out = append(out, lo)
	}
	return e.print(out, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONTENT\tRESULT\tKEY\tHOLDERS")
		for _, l := range out {
			key := l.Key
			if key == "" {
				key = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Content, l.Result, key, strings.Join(l.Holders, ","))
		}
		return tw.Flush()
	})
}

func deleteCmd(ctx context.Context, e *env, args []string) error {
	pos, err := e.parse(e.flags("delete"), args, 1, 1)
	if err != nil {
		return err
	}
	key, err := parseKey(pos[0])
	if err != nil {
		return usagef("%v", err)
	}
	_, c, err := e.connected(ctx, e.flags("delete"), nil, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	n, err := c.Delete(c.ctx, key)
	if err != nil {
		return plain("delete", err)
	}
	return e.print(map[string]int{"replicas": n}, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "deleted from %d replicas\n", n)
		return err
	})
}
