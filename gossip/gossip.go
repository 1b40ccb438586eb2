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
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrShutdown is returned by the methods of a Gossip that was shut down.
var ErrShutdown = errors.New("gossip: gossip shut down")

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

// EventKind says what happened to a member.
type EventKind uint8

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

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFail:
		return "fail"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event is one membership change.
type Event struct {
	Kind EventKind
	Node NodeMeta
	// At is when this node processed the change.
	At time.Time
}

// MemberState is the state of a known member.
type MemberState uint8

// Member states.
const (
	StateAlive MemberState = iota + 1
	StateLeft
	StateFailed
)

func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateLeft:
		return "left"
	case StateFailed:
		return "failed"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// MemberStatus is a known member with its state and when it last changed.
type MemberStatus struct {
	Meta  NodeMeta
	State MemberState
	Since time.Time
}

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
	if cfg.NodeID == "" {
		return nil, errors.New("gossip: Config.NodeID is required")
	}
	if cfg.Meta.ID == "" {
		cfg.Meta.ID = cfg.NodeID
	}
	if cfg.Meta.ID != cfg.NodeID {
		return nil, fmt.Errorf("gossip: Meta.ID %q differs from NodeID %q", cfg.Meta.ID, cfg.NodeID)
	}
	if cfg.BindAddr == "" {
		cfg.BindAddr = "0.0.0.0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.JoinRetryMax <= 0 {
		cfg.JoinRetryMax = 30 * time.Second
	}
	if cfg.DeadRetention <= 0 {
		cfg.DeadRetention = time.Hour
	}
	if cfg.ReconnectInterval == 0 {
		cfg.ReconnectInterval = 10 * cfg.Timing.withDefaults().ProbeInterval
	}
	if net.ParseIP(cfg.BindAddr) == nil {
		// memberlist would silently bind every interface.
		return nil, fmt.Errorf("gossip: BindAddr %q is not an IP address", cfg.BindAddr)
	}
	if cfg.AdvertisePort != 0 && cfg.BindPort == 0 {
		return nil, errors.New("gossip: AdvertisePort needs a fixed BindPort")
	}
	if cfg.AdvertiseAddr != "" && cfg.AdvertisePort == 0 {
		cfg.AdvertisePort = cfg.BindPort
	}
	if cfg.Keyring != nil {
		if len(cfg.Keyring.GetPrimaryKey()) == 0 {
			return nil, errors.New("gossip: Keyring has no primary key")
		}
		cfg.SecretKey = nil
	}
	switch len(cfg.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return nil, fmt.Errorf("gossip: SecretKey must be 16, 24 or 32 bytes, not %d", len(cfg.SecretKey))
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

	t := cfg.Timing.withDefaults()
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

// Join contacts seeds (host:port) and returns how many answered; an error
// when none did.
func (g *Gossip) Join(ctx context.Context, seeds []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if g.isClosed() {
		return 0, ErrShutdown
	}
	return g.join(seeds)
}

func (g *Gossip) join(seeds []string) (int, error) {
	n, err := g.ml.Join(seeds)
	if n > 0 {
		if err != nil {
			g.log.Debug("some seeds did not answer", "joined", n, "err", err)
		}
		return n, nil
	}
	if err == nil {
		err = errors.New("no seed answered")
	}
	return 0, fmt.Errorf("gossip: join %v: %w", seeds, err)
}

// otherSeeds drops this node's own address from seeds: joining oneself
// "succeeds", and nodes started together with the same seed list would
// each join only themselves and never meet.
func (g *Gossip) otherSeeds(seeds []string) []string {
	self := g.ml.LocalNode()
	port := strconv.Itoa(int(self.Port))
	anyAddr := net.ParseIP(g.cfg.BindAddr).IsUnspecified()
	var out []string
	for _, s := range seeds {
		host, p, err := net.SplitHostPort(s)
		if err == nil && p == port {
			ip := net.ParseIP(host)
			if ip != nil && (ip.Equal(self.Addr) || (ip.IsLoopback() && anyAddr)) {
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

func (g *Gossip) retryJoin(seeds []string) {
	defer g.wg.Done()
	wait := 250 * time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		if g.ml.NumMembers() > 1 {
			return // someone joined us meanwhile
		}
		n, err := g.join(seeds)
		if err == nil {
			g.log.Info("joined cluster", "seeds_answered", n)
			return
		}
		g.log.Warn("join failed; will retry", "err", err, "in", wait)
		wait = min(2*wait, g.cfg.JoinRetryMax)
		t.Reset(wait)
	}
}

// reconnectLoop tries, every ReconnectInterval, to reach the members held
// failed: a push/pull with one that is in fact alive tells it that we
// hold it dead, so it refutes, and its refutation spreads to everyone who
// holds it dead. Members that left are not tried.
func (g *Gossip) reconnectLoop() {
	defer g.wg.Done()
	t := time.NewTicker(g.cfg.ReconnectInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		addrs := g.failedAddrs()
		if len(addrs) == 0 {
			continue
		}
		// memberlist's Join is a push/pull per address, one after
		// another, each bounded by Timing.TCPTimeout; it blocks only this
		// loop, and Shutdown cuts it short (stoppableTransport).
		if n, err := g.ml.Join(addrs); n > 0 {
			g.log.Info("reconnected to members held failed", "tried", len(addrs), "answered", n)
		} else if err != nil {
			g.log.Debug("reconnect to failed members", "tried", addrs, "err", err)
		}
	}
}

// failedAddrs returns the gossip addresses of the members held failed.
func (g *Gossip) failedAddrs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	var out []string
	for id, st := range g.members {
		if st.State == StateFailed && id != g.cfg.NodeID && st.Meta.GossipAddr != "" {
			out = append(out, st.Meta.GossipAddr)
		}
	}
	slices.Sort(out)
	return out
}

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

// Leave announces that this node is leaving (the others see EventLeave,
// not EventFail) and waits, until ctx is done (at most 10 s without a
// deadline), for the announcement to spread. Call Shutdown afterwards.
func (g *Gossip) Leave(ctx context.Context) error {
	if g.isClosed() {
		return ErrShutdown
	}
	g.metaMu.Lock()
	m := g.meta
	g.metaMu.Unlock()
	m.Leaving = true
	if err := g.setMeta(m); err != nil {
		return err
	}
	// memberlist's leave is a dead message its receivers cannot tell from
	// a failure. Tell them first, twice: the flag in our metadata, and a
	// direct notice to each member over TCP, which arrives well before the
	// dead message's next gossip round (the metadata broadcast may not).
	if err := g.broadcastMeta(ctx); err != nil {
		g.log.Warn("broadcasting leave intent", "err", err)
	}
	g.sendLeaveNotices()
	if err := g.ml.Leave(timeoutOf(ctx, 10*time.Second)); err != nil {
		return fmt.Errorf("gossip: leave: %w", err)
	}
	return nil
}

const msgLeaving byte = 1

// sendLeaveNotices sends msgLeaving to every other member that is alive
// or held failed, and waits for the sends (each bounded by
// Timing.TCPTimeout). Failed members are included because "failed" may
// only mean that this node lost touch with them (a partition that healed,
// a long pause), while they are alive and may lead the cluster's metadata.
func (g *Gossip) sendLeaveNotices() {
	msg := append([]byte{msgLeaving}, g.cfg.NodeID...)
	// The addresses come from members (copies made by drain), not from
	// ml.Members(): those are pointers into memberlist's own state, which
	// its packet handler rewrites under a lock we cannot take (a data race
	// -race reported while a metadata update was being gossiped).
	to := make(map[string]memberlist.Node)
	g.mu.Lock()
	for id, st := range g.members {
		if st.State != StateAlive && st.State != StateFailed {
			continue
		}
		host, port, err := net.SplitHostPort(st.Meta.GossipAddr)
		p, perr := strconv.ParseUint(port, 10, 16)
		if ip := net.ParseIP(host); err == nil && perr == nil && ip != nil {
			to[id] = memberlist.Node{Name: id, Addr: ip, Port: uint16(p)}
		}
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, to := range to {
		if to.Name == g.cfg.NodeID {
			continue
		}
		wg.Go(func() {
			if err := g.ml.SendReliable(&to, msg); err != nil {
				g.log.Debug("leave notice not delivered", "member", to.Name, "err", err)
			}
		})
	}
	wg.Wait()
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

// Subscribe returns a channel of membership events and a function that
// ends the subscription (idempotent). The channel first carries an
// EventJoin for every member alive at the call, then every change in
// order; each subscriber has its own unbounded queue, so a slow one delays
// nobody. The channel is closed after cancel or Shutdown.
func (g *Gossip) Subscribe() (<-chan Event, func()) {
	s := newSubscriber()
	g.mu.Lock()
	if g.subs == nil { // shut down
		g.mu.Unlock()
		close(s.ch)
		close(s.done)
		return s.ch, func() {}
	}
	now := time.Now()
	ids := make([]string, 0, len(g.members))
	for id, st := range g.members {
		if st.State == StateAlive {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		s.push(Event{Kind: EventJoin, Node: g.members[id].Meta, At: now})
	}
	g.subs[s] = struct{}{}
	g.mu.Unlock()
	go s.run()
	return s.ch, func() {
		g.mu.Lock()
		delete(g.subs, s)
		g.mu.Unlock()
		s.cancel()
		<-s.done
	}
}

// drain applies memberlist's events in order until stop.
func (g *Gossip) drain() {
	defer g.wg.Done()
	var batch []queuedEvent
	for {
		select {
		case <-g.stop:
			return
		case <-g.queue.wake:
		}
		batch = g.queue.take(batch[:0])
		for i := range batch {
			g.apply(batch[i])
			batch[i] = queuedEvent{}
		}
	}
}

func (g *Gossip) apply(ev queuedEvent) {
	if ev.notice != "" {
		g.applyLeaveNotice(ev.notice)
		return
	}
	var meta NodeMeta
	if err := meta.UnmarshalBinary(ev.Node.Meta); err != nil {
		g.log.Warn("ignoring member with bad metadata", "member", ev.Node.Name, "addr", ev.Node.Address(), "err", err)
		return
	}
	if meta.ID != ev.Node.Name {
		g.log.Warn("ignoring member whose metadata names another node", "member", ev.Node.Name, "meta_id", meta.ID)
		return
	}
	meta.GossipAddr = ev.Node.Address()
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch ev.Event {
	case memberlist.NodeJoin:
		delete(g.leaving, meta.ID)
		g.record(EventJoin, meta, StateAlive, now)
	case memberlist.NodeUpdate:
		if st := g.members[meta.ID]; st != nil && st.State == StateAlive {
			now = st.Since // alive since then still
		}
		g.record(EventUpdate, meta, StateAlive, now)
	case memberlist.NodeLeave:
		_, noticed := g.leaving[meta.ID]
		delete(g.leaving, meta.ID)
		if noticed || meta.Leaving {
			g.record(EventLeave, meta, StateLeft, now)
		} else {
			g.record(EventFail, meta, StateFailed, now)
		}
	}
}

// applyLeaveNotice handles a leave notice (msgLeaving) from member id. A
// notice from a member this node already holds failed turns it into a
// member that left at once: memberlist ignores the dead message that
// follows for a member it holds dead, so no NodeLeave would ever come for
// it. Otherwise the notice is remembered, so that the death that follows
// counts as a leave.
func (g *Gossip) applyLeaveNotice(id string) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.members[id]; st != nil && st.State == StateFailed {
		g.record(EventLeave, st.Meta, StateLeft, now)
		return
	}
	if len(g.leaving) < 4096 { // bounded whatever peers send
		g.leaving[id] = now
	}
}

// record is the one place where a member's status changes: it stores the
// member in state since since (with the Leaving flag that state implies),
// forgets members gone for longer than DeadRetention and stale leave
// notices, and tells the subscribers. The event carries exactly the
// metadata that Status reports. g.mu is held.
func (g *Gossip) record(kind EventKind, meta NodeMeta, state MemberState, since time.Time) {
	switch state {
	case StateLeft:
		meta.Leaving = true
	case StateFailed:
		meta.Leaving = false
	}
	now := time.Now()
	g.members[meta.ID] = &MemberStatus{Meta: meta, State: state, Since: since}
	for id, m := range g.members {
		if m.State != StateAlive && now.Sub(m.Since) > g.cfg.DeadRetention {
			delete(g.members, id)
		}
	}
	for id, at := range g.leaving {
		if now.Sub(at) > time.Minute {
			delete(g.leaving, id) // a notice whose death never came
		}
	}
	g.log.Debug("membership", "event", kind, "member", meta.ID, "addr", meta.GossipAddr, "state", state)
	out := Event{Kind: kind, Node: meta, At: now}
	for s := range g.subs {
		s.push(out)
	}
}

// eventQueue is memberlist's EventDelegate: it queues without blocking
// (memberlist calls it holding its node lock, and a blocked send there, as
// ChannelEventDelegate can do, would stall failure detection) and wakes
// drain. Leave notices (NotifyMsg) go through it too, so that drain alone
// changes members, in the order things arrived.
type eventQueue struct {
	mu   sync.Mutex
	q    []queuedEvent
	wake chan struct{}
}

// queuedEvent is a memberlist event, or, when notice is set, a leave
// notice from the member of that ID.
type queuedEvent struct {
	memberlist.NodeEvent
	notice string
}

func (q *eventQueue) init() { q.wake = make(chan struct{}, 1) }

func (q *eventQueue) put(kind memberlist.NodeEventType, n *memberlist.Node) {
	node := *n
	node.Meta = slices.Clone(n.Meta)
	q.push(queuedEvent{NodeEvent: memberlist.NodeEvent{Event: kind, Node: &node}})
}

func (q *eventQueue) push(e queuedEvent) {
	q.mu.Lock()
	q.q = append(q.q, e)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take(dst []queuedEvent) []queuedEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, q.q...)
	clear(q.q)
	q.q = q.q[:0]
	return dst
}

// NotifyJoin implements memberlist.EventDelegate.
func (q *eventQueue) NotifyJoin(n *memberlist.Node) { q.put(memberlist.NodeJoin, n) }

// NotifyLeave implements memberlist.EventDelegate.
func (q *eventQueue) NotifyLeave(n *memberlist.Node) { q.put(memberlist.NodeLeave, n) }

// NotifyUpdate implements memberlist.EventDelegate.
func (q *eventQueue) NotifyUpdate(n *memberlist.Node) { q.put(memberlist.NodeUpdate, n) }

// subscriber forwards its queue to ch from its own goroutine.
type subscriber struct {
	ch       chan Event
	mu       sync.Mutex
	q        []Event
	wake     chan struct{}
	quit     chan struct{}
	quitOnce sync.Once
	done     chan struct{} // closed when run has returned and ch is closed
}

func newSubscriber() *subscriber {
	return &subscriber{
		ch:   make(chan Event),
		wake: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
}

func (s *subscriber) push(e Event) {
	s.mu.Lock()
	s.q = append(s.q, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) cancel() { s.quitOnce.Do(func() { close(s.quit) }) }

func (s *subscriber) run() {
	defer close(s.done)
	defer close(s.ch)
	for {
		s.mu.Lock()
		if len(s.q) == 0 {
			s.mu.Unlock()
			select {
			case <-s.quit:
				return
			case <-s.wake:
				continue
			}
		}
		e := s.q[0]
		s.q[0] = Event{}
		s.q = s.q[1:]
		s.mu.Unlock()
		select {
		case <-s.quit:
			return
		case s.ch <- e:
		}
	}
}

// metaDelegate is memberlist's Delegate: it only supplies our metadata.
type metaDelegate Gossip

// NodeMeta implements memberlist.Delegate.
func (d *metaDelegate) NodeMeta(limit int) []byte {
	d.metaMu.Lock()
	defer d.metaMu.Unlock()
	if len(d.metaB) > limit {
		return nil // cannot happen: MarshalBinary enforces MetaMaxSize
	}
	return slices.Clone(d.metaB)
}

// NotifyMsg implements memberlist.Delegate: it queues leave notices for
// drain (Gossip.applyLeaveNotice).
func (d *metaDelegate) NotifyMsg(b []byte) {
	if len(b) < 2 || b[0] != msgLeaving {
		return
	}
	d.queue.push(queuedEvent{notice: string(b[1:])})
}

// GetBroadcasts implements memberlist.Delegate.
func (d *metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (d *metaDelegate) LocalState(join bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (d *metaDelegate) MergeRemoteState(buf []byte, join bool) {}

// timeoutOf is ctx's time left, or def without a deadline.
func timeoutOf(ctx context.Context, def time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return def
}

// slogWriter turns memberlist's "[LEVEL] memberlist: msg" lines into slog
// records at that level.
type slogWriter struct{ log *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimRight(p, "\n"))
	level := slog.LevelInfo
	for _, l := range []struct {
		tag   string
		level slog.Level
	}{
		{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo},
		{"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}, {"[ERROR]", slog.LevelError},
	} {
		if rest, ok := strings.CutPrefix(line, l.tag); ok {
			level, line = l.level, strings.TrimSpace(rest)
			break
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	w.log.Log(context.Background(), level, line)
	return len(p), nil
}
