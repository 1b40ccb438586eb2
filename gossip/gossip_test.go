package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// waitLimit bounds every wait for gossip to converge: testTiming notices a
// crash within about 15 s at worst (a lone survivor gets no suspicion
// confirmations); the margin is for -race on a loaded machine.
const waitLimit = 45 * time.Second

// testTiming is LocalTiming with looser failure detection: a member that
// is starved of CPU (-race on 2 busy cores) must not be declared failed.
// With LocalTiming's 200 ms probes and x3 suspicion a stall of about half
// a second did it, and the tests that assert which members are alive, or
// that a graceful leave is a leave and not a failure, failed for reasons
// of the machine. A stall now has to last about 2 s (the suspicion
// timeout with confirmations, 4 x 500 ms); a real crash is still seen
// within seconds.
func testTiming() Timing {
	tm := LocalTiming()
	tm.ProbeInterval = 500 * time.Millisecond
	tm.ProbeTimeout = 300 * time.Millisecond
	tm.SuspicionMult = 4
	return tm
}

func testConfig(id string, seeds ...string) Config {
	return Config{
		NodeID:   id,
		BindAddr: "127.0.0.1",
		Meta: NodeMeta{
			ID: id, GRPCAddr: "127.0.0.1:1" + id[len(id)-1:], RaftAddr: "127.0.0.1:2" + id[len(id)-1:],
			Capacity: Capacity{DRAMBytes: 8 << 30},
		},
		Seeds:  seeds,
		Logger: slog.New(slog.DiscardHandler),
		Timing: testTiming(),
	}
}

func start(t *testing.T, cfg Config) *Gossip {
	t.Helper()
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown() })
	return g
}

// cluster starts n nodes n0..n{n-1}, all seeded with n0.
func cluster(t *testing.T, n int, mod func(*Config)) []*Gossip {
	t.Helper()
	gs := make([]*Gossip, n)
	for i := range gs {
		var seeds []string
		if i > 0 {
			seeds = []string{gs[0].Addr()}
		}
		cfg := testConfig(fmt.Sprintf("n%d", i), seeds...)
		if mod != nil {
			mod(&cfg)
		}
		gs[i] = start(t, cfg)
	}
	return gs
}

func memberIDs(g *Gossip) []string {
	var out []string
	for _, m := range g.Members() {
		out = append(out, m.ID)
	}
	return out
}

// waitEvent reads ch until an event matches.
func waitEvent(t *testing.T, ch <-chan Event, what string, match func(Event) bool) Event {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("channel closed waiting for %s", what)
			}
			if match(e) {
				return e
			}
		case <-timer.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestGossipClusters(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			gs := cluster(t, n, nil)
			var want []string
			for i := range n {
				want = append(want, fmt.Sprintf("n%d", i))
			}
			for _, g := range gs {
				testutil.WaitFor(t, g.LocalID()+" to see everyone", func() bool { return slices.Equal(memberIDs(g), want) })
			}
			// Everyone holds everyone's metadata, with the gossip address
			// each node really bound. (Read again until it holds: a member
			// starved of CPU may be held failed for a moment, and refute.)
			for _, g := range gs {
				var last string
				ok := func() bool {
					ms := g.Members()
					if len(ms) != n {
						last = fmt.Sprintf("%s sees %v", g.LocalID(), memberIDs(g))
						return false
					}
					for i, m := range ms {
						src := gs[i]
						if wantMeta := src.LocalMeta(); m != wantMeta || m.GossipAddr != src.Addr() {
							last = fmt.Sprintf("%s sees %+v, want %+v", g.LocalID(), m, wantMeta)
							return false
						}
					}
					return true
				}
				if !ok() {
					testutil.WaitFor(t, "everyone's metadata", ok)
					t.Logf("metadata right on a second look; first: %s", last)
				}
			}

			sub, cancel := gs[0].Subscribe()
			defer cancel()
			// The subscription starts with the current members.
			for i := range n {
				e := <-sub
				if e.Kind != EventJoin || e.Node.ID != want[i] {
					t.Fatalf("replay %d: %v %s", i, e.Kind, e.Node.ID)
				}
			}

			// A metadata update reaches everyone.
			upd := gs[1].LocalMeta()
			upd.Capacity.GPUBytes = 80 << 30
			ctx, done := context.WithTimeout(t.Context(), waitLimit)
			defer done()
			if err := gs[1].UpdateMeta(ctx, upd); err != nil {
				t.Fatal(err)
			}
			// An update, or a join if n0 held n1 failed for a moment.
			waitEvent(t, sub, "update", func(e Event) bool {
				return (e.Kind == EventUpdate || e.Kind == EventJoin) && e.Node.ID == "n1" && e.Node.Capacity.GPUBytes == 80<<30
			})
			for _, g := range gs {
				testutil.WaitFor(t, g.LocalID()+" to see the update", func() bool {
					ms := g.Members()
					return len(ms) == n && ms[1].Capacity.GPUBytes == 80<<30
				})
			}

			// A graceful leave is seen as a leave: an EventLeave comes (a
			// leave reported as a failure only never does) and Status says
			// left at the end. Not "the first event about it": on a starved
			// machine n0 may hold it failed for a moment before the leave
			// (EventFail, then EventJoin when it refutes).
			if err := gs[n-1].Leave(ctx); err != nil {
				t.Fatal(err)
			}
			if err := gs[n-1].Shutdown(); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, sub, "leave", func(e Event) bool { return e.Node.ID == want[n-1] && e.Kind == EventLeave })
			// A crash (shutdown without leave) is seen as a failure.
			if err := gs[n-2].Shutdown(); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, sub, "failure", func(e Event) bool { return e.Node.ID == want[n-2] && e.Kind == EventFail })
			for _, g := range gs[:n-2] {
				testutil.WaitFor(t, g.LocalID()+" to drop the gone", func() bool { return slices.Equal(memberIDs(g), want[:n-2]) })
			}
			st := gs[0].Status()
			if len(st) != n || st[n-1].State != StateLeft || st[n-2].State != StateFailed || st[0].State != StateAlive {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// TestGossipRestart: a node that crashed or left and comes back under the
// same name, on the same address or (after DeadNodeReclaimTime) another
// one, with new metadata, is alive again everywhere.
func TestGossipRestart(t *testing.T) {
	tests := []struct {
		name     string
		leave    bool // leave gracefully rather than crash
		samePort bool
	}{
		{"crash same address", false, true},
		{"crash new port", false, false},
		{"leave same address", true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gs := cluster(t, 3, nil)
			for _, g := range gs {
				testutil.WaitFor(t, "convergence", func() bool { return len(g.Members()) == 3 })
			}
			sub, cancel := gs[0].Subscribe()
			defer cancel()
			addr := gs[2].Addr()
			t0 := time.Now()
			if tc.leave {
				ctx, done := context.WithTimeout(t.Context(), waitLimit)
				defer done()
				if err := gs[2].Leave(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := gs[2].Shutdown(); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, sub, "n2 gone", func(e Event) bool {
				return (e.Kind == EventFail || e.Kind == EventLeave) && e.Node.ID == "n2"
			})

			t.Logf("gone after %v", time.Since(t0))
			cfg := testConfig("n2", gs[0].Addr())
			if tc.samePort {
				_, portStr, _ := net.SplitHostPort(addr)
				cfg.BindPort, _ = strconv.Atoi(portStr)
			}
			cfg.Meta.GRPCAddr = "127.0.0.1:9999"
			g2 := start(t, cfg)
			if tc.samePort && g2.Addr() != addr {
				t.Fatalf("restarted on %s, want %s", g2.Addr(), addr)
			}
			e := waitEvent(t, sub, "n2 back", func(e Event) bool { return e.Kind == EventJoin && e.Node.ID == "n2" })
			if e.Node.GRPCAddr != "127.0.0.1:9999" || e.Node.GossipAddr != g2.Addr() {
				t.Fatalf("rejoined with stale meta %+v", e.Node)
			}
			t.Logf("back after %v", time.Since(t0))
			for _, g := range []*Gossip{gs[0], gs[1], g2} {
				testutil.WaitFor(t, g.LocalID()+" to see n2 back", func() bool {
					ms := g.Members()
					return len(ms) == 3 && ms[2].GRPCAddr == "127.0.0.1:9999" && ms[2].GossipAddr == g2.Addr()
				})
			}
		})
	}
}

// TestGossipJoinRetry: a node whose seed is not up yet keeps trying and
// joins once the seed appears.
func TestGossipJoinRetry(t *testing.T) {
	// Reserve a port for the seed by starting and stopping it.
	probe := start(t, testConfig("n0"))
	seedAddr := probe.Addr()
	_, portStr, _ := net.SplitHostPort(seedAddr)
	port, _ := strconv.Atoi(portStr)
	if err := probe.Shutdown(); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("n1", seedAddr)
	cfg.JoinRetryMax = 200 * time.Millisecond
	late := start(t, cfg)
	if len(late.Members()) > 1 {
		t.Fatal("joined a seed that is down")
	}
	seedCfg := testConfig("n0")
	seedCfg.BindPort = port
	seed := start(t, seedCfg)
	for _, g := range []*Gossip{seed, late} {
		testutil.WaitFor(t, g.LocalID()+" to see both", func() bool { return len(g.Members()) == 2 })
	}
}

func TestGossipOwnAddressNotASeed(t *testing.T) {
	g := start(t, testConfig("n0"))
	_, port, _ := net.SplitHostPort(g.Addr())
	got := g.otherSeeds([]string{g.Addr(), "localhost:1", "127.0.0.2:" + port, "10.1.1.1:" + port})
	if want := []string{"localhost:1", "127.0.0.2:" + port, "10.1.1.1:" + port}; !slices.Equal(got, want) {
		t.Fatalf("otherSeeds = %v, want %v", got, want)
	}
}

func TestGossipEncryption(t *testing.T) {
	key := []byte("0123456789abcdef")
	gs := cluster(t, 3, func(c *Config) { c.SecretKey = key })
	for _, g := range gs {
		testutil.WaitFor(t, "encrypted convergence", func() bool { return len(g.Members()) == 3 })
	}
	// A node with another key cannot get in.
	other := testConfig("x9")
	other.SecretKey = []byte("fedcba9876543210")
	x := start(t, other)
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	if _, err := x.Join(ctx, []string{gs[0].Addr()}); err == nil {
		t.Fatal("joined with the wrong key")
	}
}

func TestGossipSubscriptionLifecycle(t *testing.T) {
	g := start(t, testConfig("n0"))
	ch1, cancel1 := g.Subscribe()
	ch2, _ := g.Subscribe()
	if e := <-ch1; e.Kind != EventJoin || e.Node.ID != "n0" {
		t.Fatalf("first event %+v", e)
	}
	cancel1()
	cancel1() // idempotent
	for range ch1 {
	}
	// Shutdown closes the others, even one never read.
	if err := g.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := g.Shutdown(); err != nil {
		t.Fatal(err)
	}
	for range ch2 {
	}
	ch3, cancel3 := g.Subscribe()
	if _, ok := <-ch3; ok {
		t.Fatal("subscription after shutdown delivered an event")
	}
	cancel3()
	ctx := t.Context()
	if err := g.UpdateMeta(ctx, NodeMeta{ID: "n0"}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("UpdateMeta after shutdown: %v", err)
	}
	if err := g.Leave(ctx); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Leave after shutdown: %v", err)
	}
	if _, err := g.Join(ctx, []string{"127.0.0.1:1"}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Join after shutdown: %v", err)
	}
}

func TestGossipConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"no node id", func(c *Config) { c.NodeID = "" }},
		{"meta id differs", func(c *Config) { c.Meta.ID = "other" }},
		{"bad key", func(c *Config) { c.SecretKey = []byte("short") }},
		{"meta too large", func(c *Config) { c.Meta.GRPCAddr = string(make([]byte, 600)) }},
		{"bad bind address", func(c *Config) { c.BindAddr = "256.0.0.1" }},
		{"hostname bind address", func(c *Config) { c.BindAddr = "localhost" }},
		{"advertise port with port 0", func(c *Config) { c.AdvertisePort = 7946 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("n0")
			tc.mod(&cfg)
			if g, err := Start(cfg); err == nil {
				_ = g.Shutdown()
				t.Fatal("started")
			}
		})
	}
	// An advertised address with a dynamic port advertises the bound port.
	adv := testConfig("n0")
	adv.BindAddr, adv.AdvertiseAddr = "0.0.0.0", "127.0.0.1"
	if g := start(t, adv); !strings.HasPrefix(g.Addr(), "127.0.0.1:") || strings.HasSuffix(g.Addr(), ":0") {
		t.Fatalf("advertised %s", g.Addr())
	} else if err := g.Shutdown(); err != nil {
		t.Fatal(err)
	}
	g := start(t, testConfig("n0"))
	if err := g.UpdateMeta(t.Context(), NodeMeta{ID: "n1"}); !errors.Is(err, ErrMetaInvalid) {
		t.Fatalf("UpdateMeta changing the ID: %v", err)
	}
}

func TestSlogWriterLevels(t *testing.T) {
	var got []slog.Level
	h := &levelRecorder{levels: &got}
	w := &slogWriter{log: slog.New(h)}
	for _, line := range []string{"[DEBUG] memberlist: a\n", "[WARN] memberlist: b\n", "[ERR] memberlist: c\n", "plain\n"} {
		if _, err := w.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	if want := []slog.Level{slog.LevelDebug, slog.LevelWarn, slog.LevelError, slog.LevelInfo}; !slices.Equal(got, want) {
		t.Fatalf("levels %v, want %v", got, want)
	}
}

type levelRecorder struct{ levels *[]slog.Level }

func (h *levelRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelRecorder) Handle(_ context.Context, r slog.Record) error {
	*h.levels = append(*h.levels, r.Level)
	return nil
}
func (h *levelRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelRecorder) WithGroup(string) slog.Handler      { return h }

func TestTimingDefaults(t *testing.T) {
	got := Timing{ProbeInterval: time.Millisecond}.withDefaults()
	want := LANTiming()
	want.ProbeInterval = time.Millisecond
	if got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
}

// TestGossipShutdownStopsEverything: after Shutdown no goroutine of the
// node (ours or memberlist's) is left running.
func TestGossipShutdownStopsEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	gs := make([]*Gossip, 3)
	for i := range gs {
		cfg := testConfig(fmt.Sprintf("n%d", i))
		cfg.BindAddr = fmt.Sprintf("127.0.0.%d", i+1) // distinct loopback addresses
		if i > 0 {
			cfg.Seeds = []string{gs[0].Addr()}
		}
		g, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
	}
	for _, g := range gs {
		testutil.WaitFor(t, "convergence", func() bool { return len(g.Members()) == 3 })
		_, _ = g.Subscribe() // never read, never cancelled
	}
	for _, g := range gs {
		if err := g.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestGossipReconnectsFailedMembers: a node that others hold failed, and
// that knows none of them (as after a partition during which each side
// marked the other dead), is found again by the reconnect loop; without
// it memberlist never talks to a dead member again and gossip stays split.
func TestGossipReconnectsFailedMembers(t *testing.T) {
	tests := []struct {
		name      string
		reconnect time.Duration
		wantBack  bool
	}{
		{"reconnect", 200 * time.Millisecond, true},
		{"disabled", -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gs := cluster(t, 2, func(c *Config) { c.ReconnectInterval = tc.reconnect })
			testutil.WaitFor(t, "convergence", func() bool { return len(gs[0].Members()) == 2 })
			sub, cancel := gs[0].Subscribe()
			defer cancel()
			addr := gs[1].Addr()
			if err := gs[1].Shutdown(); err != nil {
				t.Fatal(err)
			}
			waitEvent(t, sub, "n1 failed", func(e Event) bool { return e.Kind == EventFail && e.Node.ID == "n1" })
			// n1 comes back on its address knowing nobody: only n0 can
			// make the first move.
			cfg := testConfig("n1")
			_, portStr, _ := net.SplitHostPort(addr)
			cfg.BindPort, _ = strconv.Atoi(portStr)
			cfg.ReconnectInterval = -1
			g1 := start(t, cfg)
			// Not "only itself": with reconnect on, n0 may already have
			// joined it by the time its own join event is applied.
			testutil.WaitFor(t, "n1 to see itself", func() bool { return slices.Contains(memberIDs(g1), "n1") })
			if !tc.wantBack {
				// Bounded look for a join that must not happen: longer
				// than several probe and push/pull rounds of LocalTiming.
				deadline := time.Now().Add(3 * time.Second)
				for time.Now().Before(deadline) {
					if len(gs[0].Members()) != 1 || len(g1.Members()) != 1 {
						t.Fatalf("split healed without reconnect: %v / %v", memberIDs(gs[0]), memberIDs(g1))
					}
					time.Sleep(50 * time.Millisecond)
				}
				return
			}
			waitEvent(t, sub, "n1 back", func(e Event) bool { return e.Kind == EventJoin && e.Node.ID == "n1" })
			testutil.WaitFor(t, "n1 to see n0", func() bool { return len(g1.Members()) == 2 })
		})
	}
}

// TestGossipLeaveNoticeToFailedHolder: a member that holds the leaving
// node failed still learns that it left (StateLeft, EventLeave) from the
// leave notice; memberlist would send it no NodeLeave for a member it
// holds dead.
func TestGossipLeaveNoticeToFailedHolder(t *testing.T) {
	gs := cluster(t, 2, func(c *Config) { c.ReconnectInterval = -1 })
	testutil.WaitFor(t, "convergence", func() bool { return len(gs[0].Members()) == 2 && len(gs[1].Members()) == 2 })
	// Make each hold the other failed, as a partition would, by feeding
	// memberlist's own event path.
	for i, g := range gs {
		other := gs[1-i]
		var n0 *memberlist.Node
		for _, m := range g.ml.Members() {
			if m.Name == other.LocalID() {
				n0 = m
			}
		}
		if n0 == nil {
			t.Fatalf("%s does not know %s", g.LocalID(), other.LocalID())
		}
		g.queue.NotifyLeave(n0)
	}
	testutil.WaitFor(t, "both held failed", func() bool {
		for i, g := range gs {
			st := statusOf(g, gs[1-i].LocalID())
			if st == nil || st.State != StateFailed {
				return false
			}
		}
		return true
	})
	sub, cancel := gs[0].Subscribe()
	defer cancel()
	gs[1].sendLeaveNotices()
	waitEvent(t, sub, "n1 left", func(e Event) bool { return e.Kind == EventLeave && e.Node.ID == "n1" && e.Node.Leaving })
	if st := statusOf(gs[0], "n1"); st == nil || st.State != StateLeft {
		t.Fatalf("n1 status %+v, want left", st)
	}
}

func statusOf(g *Gossip, id string) *MemberStatus {
	for _, st := range g.Status() {
		if st.Meta.ID == id {
			return &st
		}
	}
	return nil
}

// TestDefaultConfig: a Config with only NodeID gets DefaultConfig's values,
// and Validate refuses what Start refuses.
func TestDefaultConfig(t *testing.T) {
	got, err := Config{NodeID: "a"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if got.BindAddr != d.BindAddr || got.Timing != d.Timing || got.JoinRetryMax != d.JoinRetryMax ||
		got.DeadRetention != d.DeadRetention || got.ReconnectInterval != d.ReconnectInterval {
		t.Errorf("defaults %+v, DefaultConfig %+v", got, d)
	}
	for _, bad := range []Config{{}, {NodeID: "a", BindAddr: "localhost"}, {NodeID: "a", AdvertisePort: 7}, {NodeID: "a", SecretKey: []byte("short")}} {
		if bad.Validate() == nil {
			t.Errorf("Validate took %+v", bad)
		}
	}
}
