package replication

import (
	"reflect"
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

// TestCopiesDropped: a dropped copy brings an anti-entropy round forward
// (the periodic one is an hour away), one round for a burst of drops.
func TestCopiesDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
			cfg.AntiEntropyInterval = time.Hour
		})
		a := c.reps["a"]
		for range 10 {
			a.CopiesDropped()
		}
		time.Sleep(aeKickGap + time.Second)
		synctest.Wait()
		if n := a.Metrics().AntiEntropyRounds; n != 1 {
			t.Fatalf("%d anti-entropy rounds after a burst of drops, want 1", n)
		}
	})
}
