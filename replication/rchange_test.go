package replication

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// settableQuorum is the cluster settings' R and W, changed while the
// Replicators run (as meta's Settings change under a node).
type settableQuorum struct{ r, w atomic.Int32 }

func (q *settableQuorum) set(r, w int) { q.r.Store(int32(r)); q.w.Store(int32(w)) }

func (q *settableQuorum) get() (int, int) { return int(q.r.Load()), int(q.w.Load()) }

// newRCluster is a cluster whose R and W come from q; cfg adds settings.
func newRCluster(t *testing.T, ids []string, q *settableQuorum, cfg func(c *Config)) *cluster {
	t.Helper()
	return newCluster(t, ids, func(id string, c *Config) {
		c.Quorum = q.get
		if cfg != nil {
			cfg(c)
		}
	})
}

// placed reports whether every key is held by exactly its r replicas.
func placed(c *cluster, keys []chunk.Key, r int) bool {
	for _, k := range keys {
		var want []string
		for _, m := range c.ring().Replicas(k.Content, r) {
			want = append(want, m.ID)
		}
		slices.Sort(want)
		if !slices.Equal(c.holders(k), want) {
			return false
		}
	}
	return true
}

// rebalanceAll runs one pass on every node and returns the bytes moved and
// keys dropped over all of them, failing on an error or pending keys.
func rebalanceAll(t *testing.T, c *cluster, ids []string) (moved int64, dropped int) {
	t.Helper()
	for _, id := range ids {
		st, err := c.reps[id].Rebalance(t.Context())
		if err != nil || st.Pending != 0 {
			t.Fatalf("%s: %+v, %v", id, st, err)
		}
		moved += st.BytesMoved
		dropped += st.KeysDropped
	}
	return moved, dropped
}

// Raising R is a change of placement like a ring change: every chunk goes
// to its new replicas, each crossing the network once per new replica, by
// a direct pass or by the background loop (rate-limited, through the
// receivers' rebalance budget); a new replica that is down leaves the
// keys pending, and a later pass completes them. New writes use the new R.
func TestRChangeUp(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	for _, tc := range []struct {
		name         string
		from, to     int
		background   bool
		downFirstRun string
		restart      bool
	}{
		{name: "1 to 3", from: 1, to: 3},
		{name: "2 to 4", from: 2, to: 4},
		{name: "1 to 3 new replica down", from: 1, to: 3, downFirstRun: "c"},
		{name: "1 to 3 background loop", from: 1, to: 3, background: true},
		// The nodes restart between the pass at R=1 and the change: the
		// placement they last completed comes back from DataDir.
		{name: "1 to 3 after a restart", from: 1, to: 3, restart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := &settableQuorum{}
				q.set(tc.from, 1)
				c := newRCluster(t, ids, q, func(cfg *Config) {
					if tc.background {
						cfg.RingCheckInterval = 5 * time.Millisecond
						cfg.RebalanceRetry = 10 * time.Millisecond
						cfg.RebalanceBytesPerSec = 4 << 20
						cfg.IncomingRebalanceStreams = 1
					}
				})
				keys, sizes := writeAll(t, c, "a", 0, 120)
				// A deleted chunk must not come back with the new R.
				if _, err := c.reps["a"].Delete(t.Context(), keys[0]); err != nil {
					t.Fatal(err)
				}
				deleted, keys := keys[0], keys[1:]
				// The first pass records the placement (the loop's first pass
				// after the restart in writeAll may not have run yet).
				rebalanceAll(t, c, ids)
				if !placed(c, keys, tc.from) {
					t.Fatalf("not placed at R=%d before the change", tc.from)
				}
				if tc.restart {
					for _, id := range ids {
						c.stop(id)
						c.net.SetDown(id, false)
						c.start(id)
					}
				}
				var want int64
				for _, k := range keys {
					want += int64(tc.to-tc.from) * int64(sizes[k])
				}
				before := c.net.Stats().Bytes
				q.set(tc.to, 2)

				if tc.background {
					for _, r := range c.reps {
						r.Kick()
					}
					testutil.WaitFor(t, "every key on its replicas at the new factor", func() bool { return placed(c, keys, tc.to) })
				} else {
					if tc.downFirstRun != "" {
						c.net.SetDown(tc.downFirstRun, true)
						pending := 0
						for _, id := range ids {
							st, _ := c.reps[id].Rebalance(t.Context())
							pending += st.Pending
							if st.KeysDropped != 0 {
								t.Fatalf("%s dropped %d keys on raising R", id, st.KeysDropped)
							}
						}
						if pending == 0 {
							t.Fatal("no key pending with a new replica down")
						}
						c.net.SetDown(tc.downFirstRun, false)
					}
					_, dropped := rebalanceAll(t, c, ids)
					if dropped != 0 {
						t.Fatalf("%d keys dropped on raising R", dropped)
					}
					if !placed(c, keys, tc.to) {
						t.Fatalf("not placed at R=%d after one pass", tc.to)
					}
				}
				// Digest calls carry no blob bytes: what crossed is the pushes.
				if moved := c.net.Stats().Bytes - before; moved != want {
					t.Fatalf("moved %d bytes, want %d (each chunk once to each new replica)", moved, want)
				}
				if h := c.holders(deleted); len(h) != 0 {
					t.Fatalf("deleted %v is back on %v", deleted, h)
				}
				// Its new replicas learnt the delete: a stale copy is refused.
				for _, m := range c.ring().Replicas(deleted.Content, tc.to) {
					if tb, ok := c.reps[m.ID].tombs.get(deleted); !ok || !tb.deleted {
						t.Fatalf("replica %s of deleted %v has no tombstone", m.ID, deleted)
					}
				}
				stale, _ := makeBlob(t, 0, 0)
				if _, err := c.reps["d"].cfg.Transport.Replicate(t.Context(), c.ring().Replicas(deleted.Content, tc.to)[tc.to-1].ID, stale, ReplicateOptions{Kind: KindRebalance}); !errors.Is(err, ErrTombstoned) {
					t.Fatalf("stale copy of a deleted chunk to its newest replica: %v, want ErrTombstoned", err)
				}
				movedKeys := func() (n int64) {
					for _, r := range c.reps {
						n += r.Metrics().RebalanceKeys
					}
					return n
				}
				wantKeys := int64(len(keys) * (tc.to - tc.from))
				// The loop counts a push just after the receiver stored it.
				testutil.WaitFor(t, "the moved keys in the metrics", func() bool { return movedKeys() >= wantKeys })
				if got := movedKeys(); got != wantKeys {
					t.Fatalf("%d keys moved in the metrics, want %d", got, wantKeys)
				}

				blob, key := makeBlob(t, 1000, 0)
				res, err := c.reps["b"].Write(t.Context(), blob)
				if err != nil || len(res.StoredOn) < 2 {
					t.Fatalf("write at R=%d: %+v, %v", tc.to, res, err)
				}
				testutil.WaitFor(t, "the new write on its replicas at the new factor", func() bool { return placed(c, []chunk.Key{key}, tc.to) })
			})
		})
	}
}

// Lowering R hands the copies beyond R off: a node that is no longer a
// replica deletes its copy only once the remaining owners acknowledged
// holding it (with them unreachable nothing goes), and a hint kept for a
// replica that the lower R dropped goes to the key's remaining owners
// instead, so that it leaves no copy nothing would trim.
func TestRChangeDown(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	for _, tc := range []struct {
		name       string
		from, to   int
		background bool
		hinted     bool
	}{
		{name: "3 to 1", from: 3, to: 1},
		{name: "4 to 2", from: 4, to: 2},
		{name: "3 to 1 background loop", from: 3, to: 1, background: true},
		{name: "3 to 1 with hints", from: 3, to: 1, hinted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := &settableQuorum{}
				q.set(tc.from, 2)
				c := newRCluster(t, ids, q, func(cfg *Config) {
					if tc.background {
						cfg.RingCheckInterval = 5 * time.Millisecond
						cfg.RebalanceRetry = 10 * time.Millisecond
					}
				})
				var keys []chunk.Key
				if tc.hinted {
					// c is down during the writes: a keeps hints for it.
					c.net.SetDown("c", true)
					for i := range 80 {
						blob, key := makeBlob(t, i, 0)
						if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
							t.Fatal(err)
						}
						keys = append(keys, key)
					}
					want := 0
					for _, k := range keys {
						if c.ring().IsReplica(k.Content, "c", tc.from) {
							want++
						}
					}
					testutil.WaitFor(t, "the hints for the down replica", func() bool { n, _ := c.reps["a"].HintsPending(); return n == want })
				} else {
					keys, _ = writeAll(t, c, "a", 0, 120)
				}
				// The first pass records the placement (with c back for it).
				c.net.SetDown("c", false)
				rebalanceAll(t, c, ids)
				c.net.SetDown("c", tc.hinted)
				q.set(tc.to, 1)

				if tc.hinted {
					c.net.SetDown("c", false)
					if _, err := c.reps["a"].DeliverHints(t.Context()); err != nil {
						t.Fatal(err)
					}
					if n, _ := c.reps["a"].HintsPending(); n != 0 {
						t.Fatalf("%d hints left", n)
					}
					for _, k := range keys {
						if c.stores["c"].Has(k) && !c.ring().IsReplica(k.Content, "c", tc.to) {
							t.Fatalf("hint delivery left %v on c, which no longer replicates it", k)
						}
					}
				}

				if tc.background {
					for _, r := range c.reps {
						r.Kick()
					}
					testutil.WaitFor(t, "every key on its replicas at the new factor", func() bool { return placed(c, keys, tc.to) })
					return
				}
				// The remaining owners unreachable: nobody deletes anything.
				for _, id := range ids {
					c.net.Partition([]string{id}, without(ids, id), true)
					st, _ := c.reps[id].Rebalance(t.Context())
					c.net.Partition([]string{id}, without(ids, id), false)
					if st.KeysDropped != 0 {
						t.Fatalf("%s dropped %d keys with their owners unreachable", id, st.KeysDropped)
					}
				}
				if !placed(c, keys, tc.from) && !tc.hinted {
					t.Fatalf("copies lost while owners were unreachable")
				}
				before := c.net.Stats().Bytes
				_, dropped := rebalanceAll(t, c, ids)
				if !placed(c, keys, tc.to) {
					t.Fatalf("not placed at R=%d after one pass", tc.to)
				}
				if moved := c.net.Stats().Bytes - before; moved != 0 && !tc.hinted {
					t.Fatalf("%d bytes moved on lowering R; the owners held every chunk", moved)
				}
				if want := len(keys) * (tc.from - tc.to); !tc.hinted && dropped != want {
					t.Fatalf("%d copies dropped, want %d", dropped, want)
				}
				// A second pass has nothing to do.
				if moved, dropped := rebalanceAll(t, c, ids); moved != 0 || dropped != 0 {
					t.Fatalf("second pass moved %d bytes and dropped %d keys", moved, dropped)
				}
			})
		})
	}
}

func without(ids []string, id string) []string {
	var out []string
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}
