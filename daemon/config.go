package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// FileConfig is the JSON configuration file of kvmeshd (-config). Every
// field mirrors the flag of the same name; flags given on the command line
// win over the file.
type FileConfig struct {
	ID      string `json:"id"`
	DataDir string `json:"data_dir"`
	GRPC    string `json:"grpc"`
	HTTP    string `json:"http"`
	// RESP is the Redis-protocol door's listen address ("": off).
	RESP   string   `json:"resp,omitempty"`
	Gossip string   `json:"gossip"`
	Raft   string   `json:"raft"`
	Join   []string `json:"join"`
	// Bootstrap starts a new one-node cluster; BootstrapExpect a new
	// cluster of that many servers. A node with neither joins (Join).
	Bootstrap       bool   `json:"bootstrap,omitempty"`
	BootstrapExpect int    `json:"bootstrap_expect"`
	DRAM            string `json:"dram"`
	// GPU is the GPU tier's budget ("0": none) on device GPUDevice; it
	// needs a kvmeshd built with the cuda tag.
	GPU       string `json:"gpu"`
	GPUDevice int    `json:"gpu_device"`
	// Admission is the DRAM tier's admission policy: "all" or "reuse".
	Admission string `json:"admission"`
	Disk      string `json:"disk"`
	DeadGrace string `json:"dead_grace"`
	// RaftRemoveAfter is how long a dead node stays a raft voter.
	RaftRemoveAfter string `json:"raft_remove_after"`
	RPCTimeout      string `json:"rpc_timeout"`
	LocalTiming     bool   `json:"local_timing"`
	Rejoin          bool   `json:"rejoin,omitempty"`
	LogLevel        string `json:"log_level"`
	// LogFormat is "text" (the default) or "json", for the log and the
	// audit log; AuditLog names the audit log's file ("-": stderr; "":
	// no audit log).
	LogFormat string `json:"log_format"`
	AuditLog  string `json:"audit_log"`
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
	// PeerLinkRate paces every connection this node dials to another
	// node to this many bytes/s in each direction ("off", the default: no
	// pacing): it emulates a slower network on one machine, for
	// benchmarks of what a codec buys.
	PeerLinkRate string `json:"peer_link_rate"`
	// SecurityFileConfig holds tls, insecure, gossip_keyring_file and
	// auth (below).
	SecurityFileConfig
}

// SecurityFileConfig is the security part of kvmeshd's configuration (see
// docs/SECURITY.md).
type SecurityFileConfig struct {
	// TLS names the CA, certificate and key files.
	TLS tlsconf.Config `json:"tls"`
	// Insecure runs without TLS (plaintext, unauthenticated); the daemon
	// refuses to start with neither TLS files nor this.
	Insecure bool `json:"insecure"`
	// GossipKeyringFile is a gossipkey keyring file (one base64 key a
	// line, primary first); without it gossip is not encrypted.
	GossipKeyringFile string `json:"gossip_keyring_file"`
	// Auth configures API tokens and per-client limits.
	Auth AuthFileConfig `json:"auth"`
}

// AuthFileConfig is the "auth" object of kvmeshd's configuration.
type AuthFileConfig struct {
	Tokens              bool `json:"tokens"`
	MaxStreamsPerClient int  `json:"max_streams_per_client"`
	MaxUnaryPerClient   int  `json:"max_unary_per_client"`
	MaxChunksPerRequest int  `json:"max_chunks_per_request"`
	// TokensFile holds token records (auth.Record as JSON, one a line, as
	// `kvmesh token create` appends them) that kvmeshd puts into the
	// metadata once it serves: the way to bootstrap the first tokens.
	TokensFile string `json:"tokens_file"`
}

// mergeFile fills the fields of fc whose flags were not set from the JSON
// file at path.
func mergeFile(path string, fc *FileConfig, set map[string]bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: -config: %w", ErrUsage, err)
	}
	var file FileConfig
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return fmt.Errorf("%w: -config %s: %w", ErrUsage, path, err)
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
	str("gpu", &fc.GPU, file.GPU)
	if !set["gpu-device"] && file.GPUDevice != 0 {
		fc.GPUDevice = file.GPUDevice
	}
	str("admission", &fc.Admission, file.Admission)
	str("disk", &fc.Disk, file.Disk)
	str("dead-grace", &fc.DeadGrace, file.DeadGrace)
	str("raft-remove-after", &fc.RaftRemoveAfter, file.RaftRemoveAfter)
	str("rpc-timeout", &fc.RPCTimeout, file.RPCTimeout)
	str("log-level", &fc.LogLevel, file.LogLevel)
	str("log-format", &fc.LogFormat, file.LogFormat)
	str("audit-log", &fc.AuditLog, file.AuditLog)
	str("anti-entropy", &fc.AntiEntropy, file.AntiEntropy)
	str("rebalance-rate", &fc.RebalanceRate, file.RebalanceRate)
	str("rebalance-recv-rate", &fc.RebalanceRecvRate, file.RebalanceRecvRate)
	str("rebalance-yield", &fc.RebalanceYield, file.RebalanceYield)
	str("peer-link-rate", &fc.PeerLinkRate, file.PeerLinkRate)
	if !set["rebalance-recv-streams"] && file.RebalanceRecvStreams != 0 {
		fc.RebalanceRecvStreams = file.RebalanceRecvStreams
	}
	if !set["startup-pull"] && file.StartupPull != nil {
		fc.StartupPull = file.StartupPull
	}
	if !set["join"] && len(file.Join) > 0 {
		fc.Join = file.Join
	}
	if !set["bootstrap"] && file.Bootstrap {
		fc.Bootstrap = true
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
func (fc FileConfig) Config(logOut io.Writer) (node.Config, error) {
	var cfg node.Config
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(fc.LogLevel)); err != nil {
		return cfg, fmt.Errorf("%w: -log-level %q: want debug, info, warn or error", ErrUsage, fc.LogLevel)
	}
	logger, err := newLogger(logOut, fc.LogFormat, lvl)
	if err != nil {
		return cfg, err
	}
	if fc.ID == "" {
		h, err := os.Hostname()
		if err != nil {
			return cfg, errors.New("kvmeshd: -id is required")
		}
		fc.ID = h
	}
	if err := checkNodeID(fc.ID); err != nil {
		return cfg, err
	}
	if fc.DataDir == "" {
		return cfg, fmt.Errorf("%w: -data-dir is required", ErrUsage)
	}
	var seeds []string
	for _, s := range fc.Join {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(s); err != nil || !isPort(port) {
			return cfg, fmt.Errorf("%w: -join %q: want gossip HOST:PORT addresses (port %d by default)", ErrUsage, s, DefaultGossipPort)
		}
		seeds = append(seeds, s)
	}
	expect, err := fc.bootstrapExpect(seeds)
	if err != nil {
		return cfg, err
	}
	addrs, err := fc.listenAddrs()
	if err != nil {
		return cfg, err
	}
	dram, err := ParseBytes(fc.DRAM)
	if err != nil {
		return cfg, fmt.Errorf("%w: -dram: %w", ErrUsage, err)
	}
	if dram == 0 {
		return cfg, fmt.Errorf("%w: -dram 0: the DRAM tier needs a positive budget", ErrUsage)
	}
	gpu, err := ParseBytes(fc.GPU)
	if fc.GPU == "" {
		gpu, err = 0, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("%w: -gpu: %w", ErrUsage, err)
	}
	if fc.GPUDevice < 0 {
		return cfg, fmt.Errorf("%w: -gpu-device %d: want a device ordinal, 0 or more", ErrUsage, fc.GPUDevice)
	}
	admission := kvtier.AdmitAll // unset in a config built by hand
	if fc.Admission != "" {
		if admission, err = kvtier.ParseAdmission(fc.Admission); err != nil {
			return cfg, fmt.Errorf("%w: -admission: %w", ErrUsage, err)
		}
	}
	dramRelease, err := dramReleaseFlag().parse(fc.DRAMRelease)
	if err != nil {
		return cfg, err
	}
	disk, err := diskBudget(fc.Disk, fc.DataDir, logger)
	if err != nil {
		return cfg, err
	}
	grace, err := positiveDuration("dead-grace", fc.DeadGrace)
	if err != nil {
		return cfg, err
	}
	raftRemove, err := positiveDuration("raft-remove-after", fc.RaftRemoveAfter)
	if err != nil {
		return cfg, err
	}
	rpcTimeout, err := positiveDuration("rpc-timeout", fc.RPCTimeout)
	if err != nil {
		return cfg, err
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
	linkRate, err := peerLinkRateFlag().parse(fc.PeerLinkRate)
	if err != nil {
		return cfg, err
	}
	cfg = node.Config{
		NodeID: fc.ID, DataDir: fc.DataDir, GRPCAddr: addrs.grpc, HTTPAddr: addrs.http, GossipAddr: addrs.gossip, RaftAddr: addrs.raft,
		Seeds: seeds, BootstrapExpect: expect, DRAMBytes: dram, DRAMReleaseBytes: dramRelease, GPUBytes: gpu, GPUDevice: fc.GPUDevice, Admission: admission, DiskBytes: disk, DeadGrace: grace,
		RaftRemoveAfter: raftRemove, RPCTimeout: rpcTimeout, LocalTiming: fc.LocalTiming, Rejoin: fc.Rejoin,
		NoStartupPull: fc.StartupPull != nil && !*fc.StartupPull, PeerLinkBytesPerSec: linkRate,
		// Without a disk tier, SIGTERM hands the node's chunks to their
		// other owners that lack them, for at most this long.
		ShutdownHandoff: 30 * time.Second,
		Replication:     rcfg,
		GPU:             linkedGPU(),
		Logger:          logger,
	}
	return cfg, fc.securityConfig(&cfg)
}

// errNoStart is the usage error of a node told neither to start a new
// cluster nor to join one: kvmeshd never bootstraps a cluster on its own
// (a node meant to join that did so would found a second cluster).
var errNoStart = fmt.Errorf("%w: no -bootstrap, -bootstrap-expect or -join: start the first node of a new cluster with -bootstrap (one node) "+
	"or -bootstrap-expect N (N servers that find each other through -join), or join a running cluster with -join HOST:PORT", ErrUsage)

// bootstrapExpect checks how the node starts and returns
// node.Config.BootstrapExpect: 1 for -bootstrap, N for -bootstrap-expect
// N, 0 (join only) for -join alone.
func (fc FileConfig) bootstrapExpect(seeds []string) (int, error) {
	n := fc.BootstrapExpect
	if n < 0 || n > MaxBootstrapExpect {
		return 0, fmt.Errorf("%w: -bootstrap-expect %d: want 1 to %d, the raft voter limit (a larger cluster bootstraps with %d; the leader adds the others)",
			ErrUsage, n, MaxBootstrapExpect, MaxBootstrapExpect)
	}
	if fc.Bootstrap {
		if n > 1 {
			return 0, fmt.Errorf("%w: -bootstrap and -bootstrap-expect %d: -bootstrap is -bootstrap-expect 1; give one of them", ErrUsage, n)
		}
		n = 1
	}
	switch {
	case n == 1 && len(seeds) > 0:
		// Alone in gossip, it would bootstrap a one-node cluster of its
		// own rather than join the seeds' one.
		return 0, fmt.Errorf("%w: a one-node bootstrap (-bootstrap, -bootstrap-expect 1) takes no -join: give only -join to join a running cluster, "+
			"or -bootstrap-expect N with -join to start N servers together", ErrUsage)
	case n == 0 && len(seeds) == 0:
		return 0, errNoStart
	}
	return n, nil
}

// isPort reports whether p is a port number, 1 to 65535.
func isPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535
}

// listeners are the four addresses a node binds.
type listeners struct{ grpc, gossip, raft, http string }

// listenAddrs fills the listener addresses left empty: the -grpc host
// with each listener's default port, or with port 0 when -grpc has port 0.
func (fc FileConfig) listenAddrs() (listeners, error) {
	l := listeners{grpc: fc.GRPC, gossip: fc.Gossip, raft: fc.Raft, http: fc.HTTP}
	if l.grpc == "" {
		l.grpc = defaultGRPCAddr()
	}
	host, port, err := net.SplitHostPort(l.grpc)
	if err != nil {
		return l, fmt.Errorf("%w: -grpc %q: want HOST:PORT (port 0: any free port)", ErrUsage, l.grpc)
	}
	def := func(addr *string, port int) {
		if *addr == "" {
			*addr = net.JoinHostPort(host, strconv.Itoa(port))
		}
	}
	if port == "0" {
		def(&l.gossip, 0)
		def(&l.raft, 0)
		def(&l.http, 0)
	} else {
		def(&l.gossip, DefaultGossipPort)
		def(&l.raft, DefaultRaftPort)
		def(&l.http, DefaultHTTPPort)
	}
	for _, a := range []struct{ flag, addr string }{{"grpc", l.grpc}, {"gossip", l.gossip}, {"raft", l.raft}, {"http", l.http}} {
		if a.flag == "http" && a.addr == "off" {
			continue
		}
		if _, p, err := net.SplitHostPort(a.addr); err != nil || (p != "0" && !isPort(p)) {
			return l, fmt.Errorf("%w: -%s %q: want HOST:PORT (port 0: any free port)", ErrUsage, a.flag, a.addr)
		}
	}
	return l, nil
}

// positiveDuration parses the value of a duration flag that has no "off"
// and no default behind zero: zero and negative durations are refused.
func positiveDuration(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: -%s %q: want a positive duration such as 10s", ErrUsage, name, v)
	}
	return d, nil
}

// checkNodeID refuses node IDs that would not survive the places an ID
// goes: keys and paths ('/'), log lines and command lines (spaces and
// control characters).
func checkNodeID(id string) error {
	if len(id) > 128 {
		return fmt.Errorf("%w: -id: longer than 128 bytes", ErrUsage)
	}
	for _, r := range id {
		if r == '/' || r == '\\' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: -id %q: no '/', '\\', spaces or control characters", ErrUsage, id)
		}
	}
	return nil
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
		return rc, fmt.Errorf("%w: -rebalance-recv-streams %d: want 1 to %d", ErrUsage, fc.RebalanceRecvStreams, maxRecvStreams)
	}
	rc.IncomingRebalanceStreams = fc.RebalanceRecvStreams
	if rc.ServingYield, err = rebalanceYieldFlag().duration(fc.RebalanceYield); err != nil {
		return rc, err
	}
	return rc, nil
}

// mergeSecurity fills the security fields of fc whose flags were not set
// from file.
func (fc *FileConfig) mergeSecurity(file *FileConfig, set map[string]bool) {
	str := func(name string, dst *string, v string) {
		if !set[name] && v != "" {
			*dst = v
		}
	}
	str("tls-ca", &fc.TLS.CAFile, file.TLS.CAFile)
	str("tls-cert", &fc.TLS.CertFile, file.TLS.CertFile)
	str("tls-key", &fc.TLS.KeyFile, file.TLS.KeyFile)
	str("tls-server-name", &fc.TLS.ServerName, file.TLS.ServerName)
	str("gossip-keyring", &fc.GossipKeyringFile, file.GossipKeyringFile)
	str("tokens-file", &fc.Auth.TokensFile, file.Auth.TokensFile)
	if !set["insecure"] && (file.Insecure || file.TLS.Insecure) {
		fc.Insecure = true
	}
	if !set["tokens"] && file.Auth.Tokens {
		fc.Auth.Tokens = true
	}
	if !set["max-streams-per-client"] && file.Auth.MaxStreamsPerClient != 0 {
		fc.Auth.MaxStreamsPerClient = file.Auth.MaxStreamsPerClient
	}
	if !set["max-unary-per-client"] && file.Auth.MaxUnaryPerClient != 0 {
		fc.Auth.MaxUnaryPerClient = file.Auth.MaxUnaryPerClient
	}
	if !set["max-chunks-per-request"] && file.Auth.MaxChunksPerRequest != 0 {
		fc.Auth.MaxChunksPerRequest = file.Auth.MaxChunksPerRequest
	}
}

// securityConfig copies the security settings into cfg, loading the
// gossip keyring file.
func (fc *FileConfig) securityConfig(cfg *node.Config) error {
	cfg.TLS = fc.TLS
	cfg.TLS.Insecure = false
	cfg.Insecure = fc.Insecure || fc.TLS.Insecure
	cfg.Tokens = fc.Auth.Tokens
	cfg.MaxStreamsPerClient = fc.Auth.MaxStreamsPerClient
	cfg.MaxUnaryPerClient = fc.Auth.MaxUnaryPerClient
	if fc.Auth.MaxChunksPerRequest < 0 {
		return fmt.Errorf("%w: -max-chunks-per-request %d: want a positive count", ErrUsage, fc.Auth.MaxChunksPerRequest)
	}
	cfg.MaxChunksPerRequest = fc.Auth.MaxChunksPerRequest
	cfg.GossipKeyringFile = fc.GossipKeyringFile
	if fc.GossipKeyringFile != "" {
		kr, err := gossipkey.LoadFile(fc.GossipKeyringFile)
		if err != nil {
			return fmt.Errorf("kvmeshd: gossip keyring: %w", err)
		}
		cfg.GossipKeyring = kr
	}
	return nil
}
