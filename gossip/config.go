package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
)

// Timing is memberlist's failure-detection and dissemination timing. Zero
// fields take the value of LANTiming.
type Timing struct {
	// ProbeInterval is how often a random member is probed; ProbeTimeout is
	// how long a direct probe waits for its ack.
	ProbeInterval, ProbeTimeout time.Duration
	// GossipInterval is how often queued broadcasts go out.
	GossipInterval time.Duration
	// PushPullInterval is how often a full state sync with a random member
	// happens.
	PushPullInterval time.Duration
	// TCPTimeout bounds a TCP exchange (push/pull, fallback probe).
	TCPTimeout time.Duration
	// GossipToTheDeadTime is how long dead members still get gossip, so
	// that they can refute their death.
	GossipToTheDeadTime time.Duration
	// DeadNodeReclaimTime is how long after its death a node's name may be
	// taken by a node on another address (a restart on a new port).
	DeadNodeReclaimTime time.Duration
	// SuspicionMult scales the time a suspect has to refute before it is
	// declared dead (SuspicionMult * log10(N) * ProbeInterval).
	SuspicionMult int
	// RetransmitMult scales how many times a broadcast is sent.
	RetransmitMult int
	// IndirectChecks is how many members probe a suspect on our behalf.
	IndirectChecks int
}

// LANTiming is memberlist's DefaultLANConfig timing (a failure is noticed
// in a few seconds), with dead names reclaimable after 30 s.
func LANTiming() Timing {
	return Timing{
		ProbeInterval:       time.Second,
		ProbeTimeout:        500 * time.Millisecond,
		GossipInterval:      200 * time.Millisecond,
		PushPullInterval:    30 * time.Second,
		TCPTimeout:          10 * time.Second,
		GossipToTheDeadTime: 30 * time.Second,
		DeadNodeReclaimTime: 30 * time.Second,
		SuspicionMult:       4,
		RetransmitMult:      4,
		IndirectChecks:      3,
	}
}

// LocalTiming is a fast timing for nodes on one machine (tests, `kvmesh
// local-cluster`): failures are noticed in about a second.
func LocalTiming() Timing {
	return Timing{
		ProbeInterval:       200 * time.Millisecond,
		ProbeTimeout:        100 * time.Millisecond,
		GossipInterval:      50 * time.Millisecond,
		PushPullInterval:    2 * time.Second,
		TCPTimeout:          time.Second,
		GossipToTheDeadTime: 5 * time.Second,
		DeadNodeReclaimTime: time.Second,
		SuspicionMult:       3,
		RetransmitMult:      2,
		IndirectChecks:      1,
	}
}

func (t Timing) withDefaults() Timing {
	d := LANTiming()
	durs := []struct{ v, def *time.Duration }{
		{&t.ProbeInterval, &d.ProbeInterval}, {&t.ProbeTimeout, &d.ProbeTimeout},
		{&t.GossipInterval, &d.GossipInterval}, {&t.PushPullInterval, &d.PushPullInterval},
		{&t.TCPTimeout, &d.TCPTimeout}, {&t.GossipToTheDeadTime, &d.GossipToTheDeadTime},
		{&t.DeadNodeReclaimTime, &d.DeadNodeReclaimTime},
	}
	for _, f := range durs {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	ints := []struct{ v, def *int }{
		{&t.SuspicionMult, &d.SuspicionMult}, {&t.RetransmitMult, &d.RetransmitMult},
		{&t.IndirectChecks, &d.IndirectChecks},
	}
	for _, f := range ints {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return t
}

// Config configures Start.
type Config struct {
	// NodeID is the node's unique name (required).
	NodeID string
	// BindAddr is the address to listen on (default "0.0.0.0"); BindPort
	// the UDP and TCP port (0: any free port, see Gossip.Addr).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what others should dial, when
	// that is not the bound address (default: the bound address).
	// AdvertisePort defaults to the bound port; memberlist ignores it when
	// BindPort is 0, so Start refuses that combination.
	AdvertiseAddr string
	AdvertisePort int
	// Meta is what the node announces; its ID defaults to NodeID and must
	// equal it.
	Meta NodeMeta
	// Seeds are host:port gossip addresses of existing members. When none
	// answers, Start still succeeds and keeps retrying in the
	// background until one does (as Consul's retry_join).
	Seeds []string
	// Logger defaults to slog.Default(); memberlist's own log lines go to
	// it at their level. Records carry no node ID of their own: the
	// caller's logger names the node (node.New's does).
	Logger *slog.Logger
	// SecretKey, if set, encrypts gossip with AES (16, 24 or 32 bytes);
	// all members need the same key. Keyring overrides it.
	SecretKey []byte
	// Keyring, if set, encrypts gossip with its primary key and decrypts
	// with any of its keys (load it with gossipkey.LoadFile); it overrides
	// SecretKey. The Gossip uses it from then on: rotate keys with
	// InstallKey, UseKey and RemoveKey rather than on the keyring itself,
	// and give each Gossip its own keyring.
	Keyring *memberlist.Keyring
	// Label, if set, separates clusters sharing a network: members only
	// talk to members with the same label.
	Label string
	// Timing defaults to LANTiming; use LocalTiming on one machine.
	Timing Timing
	// JoinRetryMax caps the backoff (starting at 250 ms, doubling) of the
	// background join retries (default 30 s).
	JoinRetryMax time.Duration
	// DeadRetention is how long Status remembers members that left or
	// failed (default 1 h).
	DeadRetention time.Duration
	// ReconnectInterval is how often the node tries to reach the members
	// it holds failed (not those that left), as Serf does: memberlist
	// neither probes nor gossips to a dead member, so two nodes that
	// marked each other dead during a partition (or a long pause) would
	// otherwise never talk again, and gossip would stay split after the
	// network healed. Default 10 probe intervals; negative disables it.
	ReconnectInterval time.Duration
}

// DefaultConfig is the configuration of every field Start defaults: the
// values a zero field takes. The caller sets NodeID (and may change the
// rest) before Start.
func DefaultConfig() Config {
	t := LANTiming()
	return Config{
		BindAddr:          "0.0.0.0",
		Timing:            t,
		JoinRetryMax:      30 * time.Second,
		DeadRetention:     time.Hour,
		ReconnectInterval: 10 * t.ProbeInterval,
	}
}

// Validate reports what Start would refuse.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults checks c and gives its zero fields DefaultConfig's values.
func (c Config) withDefaults() (Config, error) {
	if c.NodeID == "" {
		return c, errors.New("gossip: Config.NodeID is required")
	}
	if c.Meta.ID == "" {
		c.Meta.ID = c.NodeID
	}
	if c.Meta.ID != c.NodeID {
		return c, fmt.Errorf("gossip: Meta.ID %q differs from NodeID %q", c.Meta.ID, c.NodeID)
	}
	d := DefaultConfig()
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Timing = c.Timing.withDefaults()
	if c.JoinRetryMax <= 0 {
		c.JoinRetryMax = d.JoinRetryMax
	}
	if c.DeadRetention <= 0 {
		c.DeadRetention = d.DeadRetention
	}
	if c.ReconnectInterval == 0 {
		c.ReconnectInterval = 10 * c.Timing.ProbeInterval
	}
	if net.ParseIP(c.BindAddr) == nil {
		// memberlist would silently bind every interface.
		return c, fmt.Errorf("gossip: BindAddr %q is not an IP address", c.BindAddr)
	}
	if c.AdvertisePort != 0 && c.BindPort == 0 {
		return c, errors.New("gossip: AdvertisePort needs a fixed BindPort")
	}
	if c.AdvertiseAddr != "" && c.AdvertisePort == 0 {
		c.AdvertisePort = c.BindPort
	}
	if c.Keyring != nil {
		if len(c.Keyring.GetPrimaryKey()) == 0 {
			return c, errors.New("gossip: Keyring has no primary key")
		}
		c.SecretKey = nil
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return c, fmt.Errorf("gossip: SecretKey must be 16, 24 or 32 bytes, not %d", len(c.SecretKey))
	}
	return c, nil
}
