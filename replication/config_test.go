package replication

import (
	"reflect"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// TestDefaultConfig: a Config with only the required fields set gets
// exactly DefaultConfig's values, and Validate refuses a missing one.
func TestDefaultConfig(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil)
	base := Config{NodeID: "a", Store: NewInmemStore(), Transport: c.net.Transport("a"), Placement: PlacementFunc(c.ring)}
	if err := (Config{NodeID: "a"}).Validate(); err == nil {
		t.Error("Validate took a Config without Store, Transport and Placement")
	}
	got := base
	if err := got.setDefaults(); err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		f := gv.Type().Field(i)
		switch f.Type.Kind() {
		case reflect.Func, reflect.Interface, reflect.Pointer:
			if f.Name != "Logger" && gv.Field(i).IsNil() {
				t.Errorf("%s not set", f.Name)
			}
			continue
		}
		if f.Name == "NodeID" || f.Name == "DataDir" || f.Name == "Limits" {
			continue
		}
		if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
			t.Errorf("%s = %v after defaults, DefaultConfig has %v", f.Name, gv.Field(i), wv.Field(i))
		}
	}
}

// TestLearning: a new node whose ring leaves it out is still learning the
// ring and runs no background pass by it; once the ring includes it, or
// once it has completed a pass, it is not.
func TestLearning(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	d := c.start("d")
	if !d.learning(c.ring()) {
		t.Fatal("a new node outside its ring is not learning")
	}
	if c.reps["a"].learning(c.ring()) {
		t.Fatal("a member is learning")
	}
	c.setRing("a", "b", "c", "d")
	if d.learning(c.ring()) {
		t.Fatal("a node in its ring is learning")
	}
	if _, err := d.Rebalance(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.setRing("a", "b", "c")
	if d.learning(c.ring()) {
		t.Fatal("a node that completed a pass is learning: it must hand its chunks over")
	}
}

// TestCopiesDropped: copies this node's store dropped (for want of room
// below a tier, or damaged) bring a Pull round forward (the periodic round
// is an hour away), one round for a burst of drops. With room, the round
// takes the copies back from the peers; a full store fetches nothing, and
// the keys' other holders count them as below R at their rounds until
// the store has room and their pushes repair it.
func TestCopiesDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
			cfg.AntiEntropyInterval = time.Hour
		})
		keys, _ := writeAll(t, c, "a", 0, 20)
		a, sa := c.reps["a"], c.stores["a"]
		lost := keys[:3] // with R = 3 of 3 nodes, a replicates every key
		drop := func() {
			for _, k := range lost {
				if err := sa.Delete(k); err != nil {
					t.Fatal(err)
				}
			}
			for range 10 {
				a.CopiesDropped()
			}
		}
		round := func() (fetches int64) {
			t.Helper()
			before, f := a.Metrics(), c.net.Stats().Fetches
			time.Sleep(aeKickGap + time.Second)
			synctest.Wait()
			after := a.Metrics()
			if after.AntiEntropyRounds-before.AntiEntropyRounds != 1 || after.PullRounds-before.PullRounds != 1 {
				t.Fatalf("%d anti-entropy rounds (%d pull) after a burst of drops, want 1 pull round",
					after.AntiEntropyRounds-before.AntiEntropyRounds, after.PullRounds-before.PullRounds)
			}
			return c.net.Stats().Fetches - f
		}
		peersUnderR := func() int {
			t.Helper()
			n := 0
			for _, id := range []string{"b", "c"} {
				st, err := c.reps[id].AntiEntropy(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if st.UnderW != 0 {
					t.Fatalf("%s: %d keys under W with one copy lost", id, st.UnderW)
				}
				n += st.UnderR
			}
			return n
		}

		// Room here: the early round takes them back.
		drop()
		if f := round(); f != int64(len(lost)) {
			t.Fatalf("the round fetched %d copies, want the %d lost", f, len(lost))
		}
		for _, k := range lost {
			if !sa.Has(k) {
				t.Fatalf("a lacks %v after the round", k)
			}
		}

		// No room here: nothing is fetched in vain; the other holders
		// count the loss, and repair it once a has room.
		drop()
		sa.SetCapacity(sa.Bytes())
		if f := round(); f != 0 {
			t.Fatalf("a full store fetched %d copies it could not keep", f)
		}
		if slices.ContainsFunc(lost, sa.Has) {
			t.Fatal("a full store took a copy back")
		}
		if n := peersUnderR(); n != len(lost) {
			t.Fatalf("the peers count %d keys below R, want the %d a lost", n, len(lost))
		}
		sa.SetCapacity(0)
		peersUnderR() // their pushes repair a
		for _, k := range lost {
			if !sa.Has(k) {
				t.Fatalf("a lacks %v once it has room", k)
			}
		}
		if n := peersUnderR(); n != 0 {
			t.Fatalf("%d keys below R after the repair", n)
		}
	})
}
