package meta

import (
	"bytes"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/ring"
)

// TestFSMDepartureExpiry: tombstones expire DepartedTTL after the time
// carried by their leave, judged by the times carried in later commands
// (never the applying replica's clock): so a replica restored from a
// snapshot taken half way drops them at the same log entry as one that
// applied the whole log. A refresh (a later leave of the same
// incarnation) moves the expiry on; a tombstone from a leave without a
// time is stamped by the next command that carries one; an expiry with
// no ring change keeps the epoch.
func TestFSMDepartureExpiry(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	ttl := int64(DepartedTTL)
	ringAt := func(epoch uint64, at int64, ids ...string) []byte {
		rc := ringChange{Epoch: epoch, At: at}
		for _, id := range ids {
			rc.Upsert = append(rc.Upsert, member(id))
		}
		return mustEncode(t, rc)
	}
	type want struct {
		epoch uint64
		left  []departure
	}
	steps := []struct {
		name string
		cmd  []byte
		want want
	}{
		{"ring", ringAt(0, t0, "a", "b", "c", "d"), want{1, nil}},
		{"b leaves", mustEncode(t, leave{ID: "b", Incarnation: 5, At: t0}),
			want{2, []departure{{"b", 5, t0}}}},
		{"c leaves without a time (an old log)", mustEncode(t, leave{ID: "c", Incarnation: 7}),
			want{3, []departure{{"b", 5, t0}, {"c", 7, 0}}}},
		{"d leaves later", mustEncode(t, leave{ID: "d", Incarnation: 9, At: t0 + ttl/2}),
			want{4, []departure{{"b", 5, t0}, {"c", 7, t0 + ttl/2}, {"d", 9, t0 + ttl/2}}}},
		{"b's retried leave changes nothing", mustEncode(t, leave{ID: "b", Incarnation: 5, At: t0}),
			want{4, []departure{{"b", 5, t0}, {"c", 7, t0 + ttl/2}, {"d", 9, t0 + ttl/2}}}},
		{"a ring change just before b's expiry", ringAt(4, t0+ttl-1, "e"),
			want{5, []departure{{"b", 5, t0}, {"c", 7, t0 + ttl/2}, {"d", 9, t0 + ttl/2}}}},
		// The snapshot is taken here (see below).
		{"b expires with a ring change that moves nothing", ringAt(5, t0+ttl, "a"),
			want{5, []departure{{"c", 7, t0 + ttl/2}, {"d", 9, t0 + ttl/2}}}},
		{"the leader refreshes d", mustEncode(t, leave{ID: "d", Incarnation: 9, At: t0 + ttl}),
			want{5, []departure{{"c", 7, t0 + ttl/2}, {"d", 9, t0 + ttl}}}},
		{"c expires, d does not", mustEncode(t, leave{ID: "x", Incarnation: 1, At: t0 + ttl + ttl/2}),
			want{5, []departure{{"d", 9, t0 + ttl}, {"x", 1, t0 + ttl + ttl/2}}}},
		{"a ring change without a time expires nothing", ringAt(5, 0, "f"),
			want{6, []departure{{"d", 9, t0 + ttl}, {"x", 1, t0 + ttl + ttl/2}}}},
		{"d expires", ringAt(6, t0+2*ttl, "g"),
			want{7, []departure{{"x", 1, t0 + ttl + ttl/2}}}},
	}
	const snapAfter = 5 // index of "a ring change just before b's expiry"
	f := newFSM(nil)
	var g *fsm // restored from f's snapshot after step snapAfter
	for i, st := range steps {
		fsms := []*fsm{f}
		if g != nil {
			fsms = append(fsms, g)
		}
		for j, m := range fsms {
			if res := m.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: st.cmd}); res != nil {
				t.Fatalf("%s: fsm %d: Apply = %v", st.name, j, res)
			}
			s := m.state()
			if s.Epoch != st.want.epoch || !reflect.DeepEqual(s.Left, st.want.left) {
				t.Fatalf("%s: fsm %d: epoch %d left %v, want %d %v", st.name, j, s.Epoch, s.Left, st.want.epoch, st.want.left)
			}
			for _, d := range st.want.left {
				if inc, ok := m.departed(d.ID); !ok || inc != d.Incarnation {
					t.Fatalf("%s: fsm %d: departed(%s) = %d %v", st.name, j, d.ID, inc, ok)
				}
			}
		}
		if g != nil && !reflect.DeepEqual(f.state(), g.state()) {
			t.Fatalf("%s: restored replica diverged: %+v, want %+v", st.name, g.state(), f.state())
		}
		if i == snapAfter {
			g = restored(t, f)
		}
	}
	if _, ok := f.departed("b"); ok {
		t.Fatal("b's tombstone did not expire")
	}
	if r := f.currentRing(); !r.Contains("a") || r.Contains("b") {
		t.Fatalf("ring %v", r.Members())
	}
}

// TestDecodeRefusesNegativeTimes: a time before 1970 in a command or a
// snapshot is a bug or an attack; either would make expiry misbehave.
func TestDecodeRefusesNegativeTimes(t *testing.T) {
	for _, cmd := range [][]byte{
		mustEncode(t, leave{ID: "a", Incarnation: 1, At: -1}),
		mustEncode(t, ringChange{Epoch: 0, Upsert: []ring.Member{member("a")}, At: -1}),
	} {
		if _, err := decodeCommand(cmd); err == nil {
			t.Fatalf("decodeCommand(%q) accepted", cmd)
		}
	}
	bad := `{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1},"left":[{"id":"a","incarnation":1,"at":-5}]}`
	if err := newFSM(nil).Restore(io.NopCloser(bytes.NewReader([]byte(bad)))); err == nil {
		t.Fatal("Restore accepted a negative departure time")
	}
}
