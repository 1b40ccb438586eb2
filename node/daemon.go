package node

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/replication"
)

// FileConfig is the JSON configuration file of kvmeshd (-config). Every
// field mirrors the flag of the same name; flags given on the command line
// win over the file.
type FileConfig struct {
	ID              string   `json:"id"`
	DataDir         string   `json:"data_dir"`
	GRPC            string   `json:"grpc"`
	HTTP            string   `json:"http"`
	Gossip          string   `json:"gossip"`
	Raft            string   `json:"raft"`
	Join            []string `json:"join"`
	BootstrapExpect int      `json:"bootstrap_expect"`
	DRAM            string   `json:"dram"`
	Disk            string   `json:"disk"`
	DeadGrace       string   `json:"dead_grace"`
	RPCTimeout      string   `json:"rpc_timeout"`
	LocalTiming     bool     `json:"local_timing"`
	Rejoin          bool     `json:"rejoin,omitempty"`
	LogLevel        string   `json:"log_level"`
	// AntiEntropy is the period of anti-entropy rounds ("off" disables
	// them); StartupPull (default true) refills a node from its peers once
	// it is back in the ring after a start.
	AntiEntropy string `json:"anti_entropy"`
	StartupPull *bool  `json:"startup_pull,omitempty"`
	// DRAMRelease is how many bytes of freed DRAM pages stay resident
	// before they go back to the OS ("off": never; "": the default).
	DRAMRelease string `json:"dram_release"`
	// RebalanceRate limits what this node sends to new owners on a ring
	// change (bytes/s, "off": unlimited). RebalanceRecvStreams,
	// RebalanceRecvRate ("off": uncapped) and RebalanceYield ("off": no
	// waiting) are its budget as a receiver: concurrent stores of
	// incoming rebalance blobs, their bytes/s over all senders, and how
	// long each waits for serving calls in flight to finish.
	RebalanceRate        string `json:"rebalance_rate"`
	RebalanceRecvStreams int    `json:"rebalance_recv_streams"`
	RebalanceRecvRate    string `json:"rebalance_recv_rate"`
	RebalanceYield       string `json:"rebalance_yield"`
	// SecurityFileConfig holds tls, insecure, gossip_keyring_file and
	// auth (security.go).
	SecurityFileConfig
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

// RunDaemon is kvmeshd: it parses args (flags and an optional -config
// file), starts a node, prints one line
//
//	kvmeshd ready node=ID grpc=HOST:PORT gossip=HOST:PORT raft=HOST:PORT http=HOST:PORT
//
// to stdout once everything listens, and serves until ctx ends (the caller
// cancels it on SIGTERM), then shuts down cleanly. Logs go to stderr.
func RunDaemon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvmeshd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var fc FileConfig
	configPath := fs.String("config", "", "JSON configuration file (flags override it)")
	fs.StringVar(&fc.ID, "id", "", "node ID, unique in the cluster and stable across restarts (default: the host name)")
	fs.StringVar(&fc.DataDir, "data-dir", "", "data directory: raft log, snapshots, disk tier (required)")
	fs.StringVar(&fc.GRPC, "grpc", DefaultGRPCAddr, "gRPC listen address (port 0: any free port)")
	fs.StringVar(&fc.HTTP, "http", "", "HTTP listen address for /metrics, /healthz, /readyz, /debug/pprof (default: gRPC host, port 0; \"off\" disables)")
	fs.StringVar(&fc.Gossip, "gossip", "", "gossip bind address (default: gRPC host, port 0)")
	fs.StringVar(&fc.Raft, "raft", "", "raft bind address (default: gRPC host, port 0)")
	join := fs.String("join", "", "comma-separated gossip addresses of existing members")
	fs.IntVar(&fc.BootstrapExpect, "bootstrap-expect", 0, "servers that bootstrap a new cluster together (default 1 without -join, else 0)")
	fs.StringVar(&fc.DRAM, "dram", "1G", "DRAM tier budget")
	fs.StringVar(&fc.DRAMRelease, "dram-release", "", dramReleaseFlag().usage("bytes of freed DRAM pages kept resident before they go back to the OS (default: dram/8, at most 64M)"))
	fs.StringVar(&fc.Disk, "disk", "0", "disk tier budget under data-dir/tier (0: no disk tier)")
	fs.StringVar(&fc.DeadGrace, "dead-grace", "30s", "how long a dead node stays in the ring")
	fs.StringVar(&fc.RPCTimeout, "rpc-timeout", "10s", "deadline of calls to other nodes")
	fs.BoolVar(&fc.LocalTiming, "local-timing", false, "fast failure detection for nodes on one machine")
	fs.BoolVar(&fc.Rejoin, "rejoin", false, "start even though this data directory's node drained and left the cluster, and join it again")
	fs.StringVar(&fc.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&fc.AntiEntropy, "anti-entropy", "5m", antiEntropyFlag().usage("period of anti-entropy rounds between replicas"))
	startupPull := fs.Bool("startup-pull", true, "on start, once back in the ring, pull the chunks this node should hold from its peers")
	fs.StringVar(&fc.RebalanceRate, "rebalance-rate", "64M", rebalanceRateFlag().usage("bytes/s this node sends to new owners on a ring change"))
	fs.IntVar(&fc.RebalanceRecvStreams, "rebalance-recv-streams", 1, "incoming rebalance blobs stored at once; more wait, then senders are told to retry")
	fs.StringVar(&fc.RebalanceRecvRate, "rebalance-recv-rate", "off", rebalanceRecvRateFlag().usage("bytes/s of incoming rebalance blobs stored, over all senders"))
	fs.StringVar(&fc.RebalanceYield, "rebalance-yield", "100ms", rebalanceYieldFlag().usage("how long an incoming rebalance blob waits for serving calls in flight to finish"))
	fc.securityFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *join != "" {
		fc.Join = strings.Split(*join, ",")
	}
	fc.StartupPull = startupPull
	if *configPath != "" {
		set := make(map[string]bool)
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if err := mergeFile(*configPath, &fc, set); err != nil {
			return err
		}
	}
	cfg, err := fc.Config(stderr)
	if err != nil {
		return err
	}
	tokens, err := fc.tokenRecords()
	if err != nil {
		return err
	}
	n, err := New(cfg)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = n.Start(sctx)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "kvmeshd ready node=%s grpc=%s gossip=%s raft=%s http=%s\n",
		n.ID(), n.GRPCAddr(), n.GossipAddr(), n.RaftAddr(), n.HTTPAddr())
	n.daemonSecurity(ctx, tokens)
	<-ctx.Done()
	cfg.Logger.Info("kvmeshd: shutting down", "node", n.ID())
	return n.Close()
}

// mergeFile fills the fields of fc whose flags were not set from the JSON
// file at path.
func mergeFile(path string, fc *FileConfig, set map[string]bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("kvmeshd: config: %w", err)
	}
	var file FileConfig
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return fmt.Errorf("kvmeshd: config %s: %w", path, err)
	}
	str := func(name string, dst *string, v string) {
		if !set[name] && v != "" {
			*dst = v
		}
	}
	str("id", &fc.ID, file.ID)
	str("data-dir", &fc.DataDir, file.DataDir)
	str("grpc", &fc.GRPC, file.GRPC)
	str("http", &fc.HTTP, file.HTTP)
	str("gossip", &fc.Gossip, file.Gossip)
	str("raft", &fc.Raft, file.Raft)
	str("dram", &fc.DRAM, file.DRAM)
	str("dram-release", &fc.DRAMRelease, file.DRAMRelease)
	str("disk", &fc.Disk, file.Disk)
	str("dead-grace", &fc.DeadGrace, file.DeadGrace)
	str("rpc-timeout", &fc.RPCTimeout, file.RPCTimeout)
	str("log-level", &fc.LogLevel, file.LogLevel)
	str("anti-entropy", &fc.AntiEntropy, file.AntiEntropy)
	str("rebalance-rate", &fc.RebalanceRate, file.RebalanceRate)
	str("rebalance-recv-rate", &fc.RebalanceRecvRate, file.RebalanceRecvRate)
	str("rebalance-yield", &fc.RebalanceYield, file.RebalanceYield)
	if !set["rebalance-recv-streams"] && file.RebalanceRecvStreams != 0 {
		fc.RebalanceRecvStreams = file.RebalanceRecvStreams
	}
	if !set["startup-pull"] && file.StartupPull != nil {
		fc.StartupPull = file.StartupPull
	}
	if !set["join"] && len(file.Join) > 0 {
		fc.Join = file.Join
	}
	if !set["bootstrap-expect"] && file.BootstrapExpect != 0 {
		fc.BootstrapExpect = file.BootstrapExpect
	}
	if !set["local-timing"] && file.LocalTiming {
		fc.LocalTiming = true
	}
	if !set["rejoin"] && file.Rejoin {
		fc.Rejoin = true
	}
	fc.mergeSecurity(&file, set)
	return nil
}

// Config turns the file/flag configuration into a node Config, logging
// to logOut.
func (fc FileConfig) Config(logOut io.Writer) (Config, error) {
	var cfg Config
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(fc.LogLevel)); err != nil {
		return cfg, fmt.Errorf("kvmeshd: log level: %w", err)
	}
	if fc.ID == "" {
		h, err := os.Hostname()
		if err != nil {
			return cfg, errors.New("kvmeshd: -id is required")
		}
		fc.ID = h
	}
	if fc.DataDir == "" {
		return cfg, errors.New("kvmeshd: -data-dir is required")
	}
	dram, err := ParseBytes(fc.DRAM)
	if err != nil {
		return cfg, fmt.Errorf("kvmeshd: -dram: %w", err)
	}
	dramRelease, err := dramReleaseFlag().parse(fc.DRAMRelease)
	if err != nil {
		return cfg, err
	}
	disk, err := ParseBytes(fc.Disk)
	if err != nil {
		return cfg, fmt.Errorf("kvmeshd: -disk: %w", err)
	}
	grace, err := time.ParseDuration(fc.DeadGrace)
	if err != nil {
		return cfg, fmt.Errorf("kvmeshd: -dead-grace: %w", err)
	}
	rpcTimeout, err := time.ParseDuration(fc.RPCTimeout)
	if err != nil {
		return cfg, fmt.Errorf("kvmeshd: -rpc-timeout: %w", err)
	}
	antiEntropy, err := antiEntropyFlag().duration(fc.AntiEntropy)
	if err != nil {
		return cfg, err
	}
	rcfg, err := fc.rebalanceConfig()
	if err != nil {
		return cfg, err
	}
	rcfg.AntiEntropyInterval = antiEntropy
	var seeds []string
	for _, s := range fc.Join {
		if s = strings.TrimSpace(s); s != "" {
			seeds = append(seeds, s)
		}
	}
	cfg = Config{
		NodeID: fc.ID, DataDir: fc.DataDir, GRPCAddr: fc.GRPC, HTTPAddr: fc.HTTP, GossipAddr: fc.Gossip, RaftAddr: fc.Raft,
		Seeds: seeds, BootstrapExpect: fc.BootstrapExpect, DRAMBytes: dram, DRAMReleaseBytes: dramRelease, DiskBytes: disk, DeadGrace: grace,
		RPCTimeout: rpcTimeout, LocalTiming: fc.LocalTiming, Rejoin: fc.Rejoin,
		NoStartupPull: fc.StartupPull != nil && !*fc.StartupPull,
		Replication:   rcfg,
		Logger:        slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lvl})),
	}
	return cfg, fc.securityConfig(&cfg)
}

// maxRecvStreams bounds -rebalance-recv-streams.
const maxRecvStreams = 1024

// rebalanceConfig parses the rebalance flags into replication's settings
// ("" keeps replication's default).
func (fc FileConfig) rebalanceConfig() (replication.Config, error) {
	var rc replication.Config
	var err error
	if rc.RebalanceBytesPerSec, err = rebalanceRateFlag().parse(fc.RebalanceRate); err != nil {
		return rc, err
	}
	if rc.IncomingRebalanceBytesPerSec, err = rebalanceRecvRateFlag().parse(fc.RebalanceRecvRate); err != nil {
		return rc, err
	}
	if fc.RebalanceRecvStreams < 0 || fc.RebalanceRecvStreams > maxRecvStreams {
		return rc, fmt.Errorf("kvmeshd: -rebalance-recv-streams %d: 1 to %d", fc.RebalanceRecvStreams, maxRecvStreams)
	}
	rc.IncomingRebalanceStreams = fc.RebalanceRecvStreams
	if rc.ServingYield, err = rebalanceYieldFlag().duration(fc.RebalanceYield); err != nil {
		return rc, err
	}
	return rc, nil
}
