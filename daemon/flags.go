package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/meta"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/replication"
)

// ErrUsage is wrapped by errors in kvmeshd's command line (an unknown
// flag, a stray argument, a value a flag refuses); kvmeshd exits 2 on
// them, as on -h.
var ErrUsage = errors.New("kvmeshd: bad command line")

// MaxBootstrapExpect is the largest -bootstrap-expect: the Raft voter
// limit. Larger clusters bootstrap with that many servers; the others
// wait to be added by the leader.
const MaxBootstrapExpect = meta.DefaultMaxVoters

// Default ports of kvmeshd's listeners: one block, so that firewall rules
// and seed lists are predictable. Each listener binds the -grpc host with
// its port unless its flag says otherwise; with -grpc port 0 (tests,
// local clusters) every listener defaults to port 0, any free port.
const (
	DefaultGRPCPort   = 7400
	DefaultGossipPort = 7401
	DefaultRaftPort   = 7402
	DefaultHTTPPort   = 7403
)

// defaultGRPCAddr is -grpc's default: loopback, so that a node started
// without flags serves nobody else by accident.
func defaultGRPCAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultGRPCPort)) }

// parseArgs reads kvmeshd's command line into a FileConfig: the flags,
// then the -config file for every setting whose flag was not given.
func parseArgs(args []string, stderr io.Writer) (FileConfig, error) {
	fs := flag.NewFlagSet("kvmeshd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var fc FileConfig
	// The defaults are the packages' own, so the two never drift.
	repl := replication.DefaultConfig()
	configPath := fs.String("config", "", "JSON configuration file (flags override it)")
	fs.StringVar(&fc.ID, "id", "", "node ID, unique in the cluster and stable across restarts (default: the host name)")
	fs.StringVar(&fc.DataDir, "data-dir", "", "data directory: raft log, snapshots, disk tier (required)")
	fs.StringVar(&fc.GRPC, "grpc", defaultGRPCAddr(), "gRPC listen address (port 0: any free port, and the other listeners' default port 0 too)")
	fs.StringVar(&fc.HTTP, "http", "", fmt.Sprintf("HTTP listen address for /metrics, /healthz, /readyz, /debug/pprof (default: gRPC host, port %d; \"off\" disables)", DefaultHTTPPort))
	fs.StringVar(&fc.RESP, "resp", "", "Redis-protocol (RESP) listen address: GET, SET, DEL and more on opaque values, with TLS when the node has it (default: off; docs/REDIS.md)")
	fs.StringVar(&fc.Gossip, "gossip", "", fmt.Sprintf("gossip bind address, TCP and UDP (default: gRPC host, port %d)", DefaultGossipPort))
	fs.StringVar(&fc.Raft, "raft", "", fmt.Sprintf("raft bind address (default: gRPC host, port %d)", DefaultRaftPort))
	join := fs.String("join", "", "comma-separated gossip addresses of members to join; until one answers the node retries (backoff up to 30s), logs each failure and is not ready")
	fs.BoolVar(&fc.Bootstrap, "bootstrap", false, "start a new one-node cluster (-bootstrap-expect 1); takes no -join")
	fs.IntVar(&fc.BootstrapExpect, "bootstrap-expect", 0, fmt.Sprintf("start a new cluster of this many servers, 1 to %d, that find each other through -join (0: none; then -join is required)", MaxBootstrapExpect))
	fs.StringVar(&fc.DRAM, "dram", FormatBytes(node.DefaultDRAMBytes), "DRAM tier budget (positive)")
	fs.StringVar(&fc.GPU, "gpu", "0", "GPU tier budget in device memory, reserved at start (0: no GPU tier; needs kvmeshd built with -tags cuda)")
	fs.IntVar(&fc.GPUDevice, "gpu-device", 0, "ordinal of the GPU the GPU tier uses")
	fs.StringVar(&fc.Admission, "admission", "all", "which puts the store keeps: all (every put, until evicted) or reuse (what is predicted to be read again: encodings usable at any position, windows, the first prefix-chained encoding of a content; another prefix-chained copy only on its second put; eviction weighted by reuse)")
	fs.StringVar(&fc.DRAMRelease, "dram-release", "", dramReleaseFlag().usage("bytes of freed DRAM pages kept resident before they go back to the OS (default: dram/8, at most 64M)"))
	fs.StringVar(&fc.Disk, "disk", autoDisk, "disk tier budget under data-dir/tier (0: no disk tier; auto: at the first start half the data directory's free space, at most 64G, none under 64M, kept in data-dir/disk-budget); SIGTERM writes DRAM to it and a restart reads it back")
	fs.StringVar(&fc.DeadGrace, "dead-grace", FormatDuration(meta.DefaultDeadGrace), "how long a dead node stays in the ring (positive)")
	fs.StringVar(&fc.RaftRemoveAfter, "raft-remove-after", FormatDuration(meta.DefaultRaftRemoveAfter), "how long a dead node stays a raft voter (positive; never less than -dead-grace, the larger applies)")
	fs.StringVar(&fc.RPCTimeout, "rpc-timeout", FormatDuration(node.DefaultRPCTimeout), "deadline of calls to other nodes (positive)")
	fs.BoolVar(&fc.LocalTiming, "local-timing", false, "fast failure detection for nodes on one machine")
	fs.BoolVar(&fc.Rejoin, "rejoin", false, "start even though this data directory's node drained and left the cluster, and join it again")
	fs.StringVar(&fc.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&fc.LogFormat, "log-format", "text", "log format, of the log and the audit log: text or json")
	fs.StringVar(&fc.AuditLog, "audit-log", "", "audit log of admin calls, refused ones included: a file appended to, \"-\" for stderr (default: none)")
	fs.StringVar(&fc.AntiEntropy, "anti-entropy", FormatDuration(repl.AntiEntropyInterval), antiEntropyFlag().usage("period of anti-entropy rounds between replicas"))
	startupPull := fs.Bool("startup-pull", true, "on start, once back in the ring, pull the chunks this node should hold from its peers")
	fs.StringVar(&fc.RebalanceRate, "rebalance-rate", FormatBytes(repl.RebalanceBytesPerSec), rebalanceRateFlag().usage("bytes/s this node sends to new owners on a ring change"))
	fs.IntVar(&fc.RebalanceRecvStreams, "rebalance-recv-streams", repl.IncomingRebalanceStreams, fmt.Sprintf("incoming rebalance blobs stored at once, 1 to %d; more wait, then senders are told to retry", maxRecvStreams))
	fs.StringVar(&fc.RebalanceRecvRate, "rebalance-recv-rate", "off", rebalanceRecvRateFlag().usage("bytes/s of incoming rebalance blobs stored, over all senders"))
	fs.StringVar(&fc.RebalanceYield, "rebalance-yield", FormatDuration(repl.ServingYield), rebalanceYieldFlag().usage("how long an incoming rebalance blob waits for serving calls in flight to finish"))
	fs.StringVar(&fc.PeerLinkRate, "peer-link-rate", "off", peerLinkRateFlag().usage("bytes/s each direction of every connection this node dials to another node is paced to, emulating a slower network on one machine (benchmarks; e.g. 125000000 for 1 Gbit/s)"))
	fc.securityFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return fc, err
		}
		return fc, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fc, fmt.Errorf("%w: unexpected argument %q (kvmeshd takes only flags)", ErrUsage, fs.Arg(0))
	}
	// A zero here was given on the command line: the flags' defaults are
	// not zero, and a zero in the file means "not set".
	if fc.RebalanceRecvStreams == 0 {
		return fc, fmt.Errorf("%w: -rebalance-recv-streams 0: want 1 to %d", ErrUsage, maxRecvStreams)
	}
	if fc.Auth.MaxStreamsPerClient == 0 {
		return fc, fmt.Errorf("%w: -max-streams-per-client 0: want a positive limit, or a negative value for no limit", ErrUsage)
	}
	if fc.Auth.MaxUnaryPerClient == 0 {
		return fc, fmt.Errorf("%w: -max-unary-per-client 0: want a positive limit, or a negative value for no limit", ErrUsage)
	}
	if fc.Auth.MaxChunksPerRequest == 0 {
		return fc, fmt.Errorf("%w: -max-chunks-per-request 0: want a positive count", ErrUsage)
	}
	if *join != "" {
		fc.Join = strings.Split(*join, ",")
	}
	fc.StartupPull = startupPull
	if *configPath != "" {
		set := make(map[string]bool)
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if err := mergeFile(*configPath, &fc, set); err != nil {
			return fc, err
		}
	}
	return fc, nil
}

// securityFlags registers the security flags of kvmeshd.
func (fc *FileConfig) securityFlags(fs *flag.FlagSet) {
	fs.StringVar(&fc.TLS.CAFile, "tls-ca", "", "cluster CA certificate (PEM)")
	fs.StringVar(&fc.TLS.CertFile, "tls-cert", "", "this node's certificate (PEM; a node certificate, as kvmesh certs -node makes)")
	fs.StringVar(&fc.TLS.KeyFile, "tls-key", "", "this node's private key (PEM)")
	fs.StringVar(&fc.TLS.ServerName, "tls-server-name", "", "name checked in peers' certificates instead of the dialed host")
	fs.BoolVar(&fc.Insecure, "insecure", false, "run WITHOUT TLS: plaintext and unauthenticated (single machine and tests only)")
	fs.StringVar(&fc.GossipKeyringFile, "gossip-keyring", "", "gossip keyring file (base64 keys, primary first, mode 0600)")
	fs.BoolVar(&fc.Auth.Tokens, "tokens", false, "require API tokens (authorization: Bearer) from clients")
	fs.IntVar(&fc.Auth.MaxStreamsPerClient, "max-streams-per-client", auth.DefaultMaxStreams, "concurrent streams per client (negative: no limit; 0 is refused)")
	fs.IntVar(&fc.Auth.MaxUnaryPerClient, "max-unary-per-client", auth.DefaultMaxUnary, "unary calls in flight per client, members excepted (negative: no limit; 0 is refused)")
	fs.IntVar(&fc.Auth.MaxChunksPerRequest, "max-chunks-per-request", node.MaxLookupBatch, "chunks one Lookup or Inject may name (positive)")
	fs.StringVar(&fc.Auth.TokensFile, "tokens-file", "", "token records to store at start (JSON lines, as kvmesh token create appends)")
}

// ParseBytes parses a byte size: a number with an optional K, M, G or T
// suffix (powers of 1024; "KiB", "MB" and the like are read the same).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad byte size %q", s)
	}
	return v * mult, nil
}

// FormatBytes is n as ParseBytes reads it: in the largest unit that
// divides it (64M, 1G, 1536K).
func FormatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// FormatDuration is d as a flag's default reads best: time.Duration's
// form without its zero tails (5m, not 5m0s).
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// zeroMeans is what an offFlag makes of "0". It differs by flag, on
// purpose: a zero yield is no waiting, but a zero rate or a zero release
// budget would be a setting nobody wants, and "0" for the anti-entropy
// period has always meant the default. The help text of each flag says
// which.
type zeroMeans int

const (
	// zeroRefused: "0" is an error; the flag takes a positive value,
	// "off" or "".
	zeroRefused zeroMeans = iota
	// zeroIsOff: "0" is the same as "off".
	zeroIsOff
	// zeroIsDefault: "0" is the same as "" (the default).
	zeroIsDefault
)

// offFlag is a kvmeshd setting that takes a positive quantity (a byte
// size, a rate or a duration), "off", or "" for the default, in flags and
// in the JSON file alike. Every such setting is parsed here so the words
// mean the same everywhere; what "off" gives, and what "0" means, is per
// flag (off, zero) and stated in its help text (usage).
type offFlag struct {
	name string
	// kind is how a value is read: offBytes or offDuration.
	kind offKind
	// off is the configuration value "off" stands for: -1 where the
	// consumer reads a negative value as off, 0 where zero is its off.
	off int64
	// offDoc says what "off" does, for the help text.
	offDoc string
	zero   zeroMeans
}

// offKind is how an offFlag reads a positive value.
type offKind int

const (
	offBytes    offKind = iota // ParseBytes (a size, or bytes per second)
	offDuration                // time.ParseDuration
)

// errOffFlag is wrapped by every offFlag parse error.
// It is a usage error.
var errOffFlag = fmt.Errorf("%w: bad setting", ErrUsage)

// parse reads s: "" (and "0" for zeroIsDefault) gives 0, the consumer's
// default; "off" (and "0" for zeroIsOff) gives f.off; else a positive
// value.
func (f offFlag) parse(s string) (int64, error) {
	v := strings.TrimSpace(s)
	switch {
	case v == "":
		return 0, nil
	case v == "off":
		return f.off, nil
	case v == "0" && f.zero == zeroIsOff:
		return f.off, nil
	case v == "0" && f.zero == zeroIsDefault:
		return 0, nil
	}
	var n int64
	var err error
	switch f.kind {
	case offDuration:
		var d time.Duration
		d, err = time.ParseDuration(v)
		n = int64(d)
	default:
		n, err = ParseBytes(v)
	}
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: -%s %q: %s", errOffFlag, f.name, s, f.want())
	}
	return n, nil
}

// duration is parse for a duration setting.
func (f offFlag) duration(s string) (time.Duration, error) {
	n, err := f.parse(s)
	return time.Duration(n), err
}

// want says what the flag accepts, for errors.
func (f offFlag) want() string {
	unit := "a positive byte size"
	if f.kind == offDuration {
		unit = "a positive duration"
	}
	return unit + ` or "off"`
}

// usage is the help text of the flag: what, then what "off" and "0" do.
func (f offFlag) usage(what string) string {
	var zero string
	switch f.zero {
	case zeroIsOff:
		zero = `"0" is "off"`
	case zeroIsDefault:
		zero = `"0" is the default`
	default:
		zero = `"0" is refused`
	}
	return fmt.Sprintf(`%s; "off": %s; %s`, what, f.offDoc, zero)
}

// The offFlags of kvmeshd. Functions, not variables: the package keeps no
// globals.

func dramReleaseFlag() offFlag {
	return offFlag{name: "dram-release", kind: offBytes, off: -1, offDoc: "never (freed pages stay resident)", zero: zeroRefused}
}

func antiEntropyFlag() offFlag {
	return offFlag{name: "anti-entropy", kind: offDuration, off: -1, offDoc: "no rounds", zero: zeroIsDefault}
}

func rebalanceRateFlag() offFlag {
	return offFlag{name: "rebalance-rate", kind: offBytes, off: -1, offDoc: "unlimited", zero: zeroRefused}
}

func rebalanceRecvRateFlag() offFlag {
	return offFlag{name: "rebalance-recv-rate", kind: offBytes, off: 0, offDoc: "uncapped", zero: zeroRefused}
}

func peerLinkRateFlag() offFlag {
	return offFlag{name: "peer-link-rate", kind: offBytes, off: 0, offDoc: "no pacing", zero: zeroRefused}
}

func rebalanceYieldFlag() offFlag {
	return offFlag{name: "rebalance-yield", kind: offDuration, off: -1, offDoc: "no waiting", zero: zeroIsOff}
}
