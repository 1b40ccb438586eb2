// Package gossip keeps track of which nodes of a kvmesh cluster are alive.
//
// Gossip wraps hashicorp/memberlist: each node gossips a small NodeMeta
// (its ID, gRPC and Raft addresses and tier capacities), and subscribers
// get join, update, leave and failure events. Gossip is encrypted with a
// shared key or keyring (Config.SecretKey, Keyring), and a running node
// rotates keys with InstallKey, UseKey and RemoveKey (the three steps of
// package gossip/gossipkey). Turning gossip into ring epochs is the
// metadata layer's job (package meta), not this one's; placement is
// package ring's.
//
// The keys themselves (generating them, the keyring file format, the
// rotation steps on a memberlist keyring) live in the subpackage gossipkey:
// the operator CLI and the daemon's config handle key files without a
// running Gossip, and names such as gossipkey.Generate and
// gossipkey.LoadFile say what they are about.
package gossip

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrShutdown is returned by the methods of a Gossip that was shut down.
var ErrShutdown = errors.New("gossip: gossip shut down")

// Event kinds.
const (
	// EventJoin: a member became alive (joined, or came back).
	EventJoin EventKind = iota + 1
	// EventUpdate: an alive member changed its metadata.
	EventUpdate
	// EventLeave: a member left gracefully (Gossip.Leave).
	EventLeave
	// EventFail: a member was declared dead by failure detection.
	EventFail
)

// Member states.
const (
	StateAlive MemberState = iota + 1
	StateLeft
	StateFailed
)

// Gossip is this node's membership in the cluster. Its methods are safe
// for concurrent use.
type Gossip struct {
	cfg Config
	log *slog.Logger
	ml  *memberlist.Memberlist
	// addr is the advertised host:port, fixed once memberlist started.
	addr string

	metaMu sync.Mutex
	meta   NodeMeta // what we announce
	metaB  []byte   // its encoding, handed to memberlist

	// queue receives memberlist's events without ever blocking it; drain,
	// the only reader, applies them to members and fans them out.
	queue eventQueue

	// keyring is memberlist's keyring: cfg.Keyring, one made from
	// SecretKey, or nil when gossip is not encrypted. It has its own lock.
	keyring *memberlist.Keyring

	mu      sync.Mutex
	members map[string]*MemberStatus
	subs    map[*subscriber]struct{}
	closed  bool
	// leaving holds the leave notices (msgLeaving) received, by node ID,
	// so that the death that follows counts as a leave.
	leaving map[string]time.Time

	stop     chan struct{}
	wg       sync.WaitGroup
	shutOnce sync.Once
}

// Start creates the node's memberlist, starts draining its events
// and joins cfg.Seeds (retrying in the background if none answers).
func Start(cfg Config) (*Gossip, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Meta.Leaving, cfg.Meta.GossipAddr = false, ""
	metaB, err := cfg.Meta.MarshalBinary()
	if err != nil {
		return nil, err
	}
	g := &Gossip{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "gossip"),
		meta:    cfg.Meta,
		metaB:   metaB,
		members: make(map[string]*MemberStatus),
		subs:    make(map[*subscriber]struct{}),
		leaving: make(map[string]time.Time),
		stop:    make(chan struct{}),
	}
	g.queue.init()

	t := cfg.Timing
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeID
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	mc.Label = cfg.Label
	// With SecretKey memberlist makes the keyring itself (mc.Keyring
	// after Create), so rotation works whichever way the key came.
	mc.SecretKey = slices.Clone(cfg.SecretKey)
	mc.Keyring = cfg.Keyring
	mc.ProbeInterval, mc.ProbeTimeout = t.ProbeInterval, t.ProbeTimeout
	mc.GossipInterval, mc.PushPullInterval = t.GossipInterval, t.PushPullInterval
	mc.TCPTimeout, mc.GossipToTheDeadTime = t.TCPTimeout, t.GossipToTheDeadTime
	mc.DeadNodeReclaimTime = t.DeadNodeReclaimTime
	mc.SuspicionMult, mc.RetransmitMult, mc.IndirectChecks = t.SuspicionMult, t.RetransmitMult, t.IndirectChecks
	mc.Delegate = (*metaDelegate)(g)
	mc.Events = &g.queue
	mc.Logger = log.New(&slogWriter{log: g.log}, "", 0)
	tr, err := newStoppableTransport(cfg.BindAddr, cfg.BindPort, mc.Logger)
	if err != nil {
		return nil, fmt.Errorf("gossip: start gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	mc.Transport = tr
	if mc.BindPort == 0 {
		// What memberlist.Create does with a port it picked itself.
		mc.BindPort = tr.GetAutoBindPort()
		mc.AdvertisePort = mc.BindPort
	}

	g.wg.Add(1)
	go g.drain()

	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown()
		close(g.stop)
		g.wg.Wait()
		return nil, fmt.Errorf("gossip: start gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	g.ml = ml
	// Read once: memberlist rewrites its local node (the same address)
	// under its own lock on every metadata update, so reading LocalNode
	// later races with UpdateMeta.
	g.addr = ml.LocalNode().Address()
	g.keyring = mc.Keyring

	if cfg.ReconnectInterval > 0 {
		g.wg.Add(1)
		go g.reconnectLoop()
	}
	if seeds := g.otherSeeds(cfg.Seeds); len(seeds) > 0 {
		if _, err := g.join(seeds); err != nil {
			g.log.Warn("no seed answered; retrying in the background", "seeds", seeds, "err", err)
			g.wg.Add(1)
			go g.retryJoin(seeds)
		}
	}
	return g, nil
}

// Addr is the host:port this node gossips on (the advertised address).
func (g *Gossip) Addr() string { return g.addr }

// LocalID is the node's ID.
func (g *Gossip) LocalID() string { return g.cfg.NodeID }

// Members returns the alive members with their metadata, sorted by ID,
// this node included.
func (g *Gossip) Members() []NodeMeta {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]NodeMeta, 0, len(g.members))
	for _, st := range g.members {
		if st.State == StateAlive {
			out = append(out, st.Meta)
		}
	}
	slices.SortFunc(out, func(a, b NodeMeta) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Status returns every known member, alive or not (those gone for longer
// than DeadRetention are forgotten), sorted by ID.
func (g *Gossip) Status() []MemberStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]MemberStatus, 0, len(g.members))
	for _, st := range g.members {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b MemberStatus) int { return strings.Compare(a.Meta.ID, b.Meta.ID) })
	return out
}

// LocalMeta returns what this node currently announces, with its
// GossipAddr.
func (g *Gossip) LocalMeta() NodeMeta {
	g.metaMu.Lock()
	m := g.meta
	g.metaMu.Unlock()
	m.GossipAddr = g.Addr()
	return m
}

// UpdateMeta changes what this node announces and waits, until ctx is done
// (at most 10 s without a deadline), for the change to be broadcast. The
// ID may not change.
func (g *Gossip) UpdateMeta(ctx context.Context, m NodeMeta) error {
	if m.ID == "" {
		m.ID = g.cfg.NodeID
	}
	if m.ID != g.cfg.NodeID {
		return fmt.Errorf("%w: ID %q differs from NodeID %q", ErrMetaInvalid, m.ID, g.cfg.NodeID)
	}
	m.GossipAddr = ""
	if err := g.setMeta(m); err != nil {
		return err
	}
	return g.broadcastMeta(ctx)
}

func (g *Gossip) setMeta(m NodeMeta) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	g.metaMu.Lock()
	g.meta, g.metaB = m, b
	g.metaMu.Unlock()
	return nil
}

func (g *Gossip) broadcastMeta(ctx context.Context) error {
	if g.isClosed() {
		return ErrShutdown
	}
	if err := g.ml.UpdateNode(timeoutOf(ctx, 10*time.Second)); err != nil {
		return fmt.Errorf("gossip: broadcast meta: %w", err)
	}
	return ctx.Err()
}

// Shutdown stops gossip without announcing anything (the others will
// detect a failure unless Leave was called first), stops the goroutines and
// closes every subscription channel. It is idempotent.
//
// It does not wait for unreachable members: the TCP exchanges in progress
// (a reconnect to members held failed, a join retry, a leave notice) are
// cancelled, so Shutdown takes about as long as memberlist's own teardown
// and the drain of queued events, whatever the number of dead members,
// never a TCPTimeout per member.
func (g *Gossip) Shutdown() error {
	var err error
	g.shutOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		g.mu.Unlock()
		// memberlist first, so that no event arrives after drain stopped.
		err = g.ml.Shutdown()
		close(g.stop)
		g.wg.Wait()
		g.mu.Lock()
		subs := g.subs
		g.subs = nil
		g.mu.Unlock()
		for s := range subs {
			s.cancel()
		}
		for s := range subs {
			<-s.done
		}
	})
	return err
}

func (g *Gossip) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// timeoutOf is ctx's time left, or def without a deadline.
func timeoutOf(ctx context.Context, def time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return def
}
