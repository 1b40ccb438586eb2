package meta

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

func mustEncode(t testing.TB, c command) []byte {
	t.Helper()
	b, err := encodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func member(id string) ring.Member {
	return ring.Member{ID: id, GRPCAddr: "grpc-" + id, RaftAddr: "raft-" + id, Weight: 2}
}

// TestFSMApply drives the FSM through a sequence of commands, valid and
// not, checking the result and the state after each.
func TestFSMApply(t *testing.T) {
	badSpec := testSpec(1)
	badSpec.HeadDim = 3
	longSalt := testSpec(1)
	longSalt.Salt = strings.Repeat("s", chunk.MaxSpecString+1)
	f := newFSM(nil)
	type want struct {
		err     error
		models  int
		epoch   uint64
		members []string
		set     Settings
	}
	def := DefaultSettings()
	custom := Settings{ReplicationFactor: 5, WriteQuorum: 3, Codec: chunk.CodecInt8}
	steps := []struct {
		name string
		cmd  []byte
		want want
	}{
		{"register", mustEncode(t, registerModel{testSpec(1)}), want{nil, 1, 0, nil, def}},
		{"register again", mustEncode(t, registerModel{testSpec(1)}), want{nil, 1, 0, nil, def}},
		{"register other", mustEncode(t, registerModel{testSpec(2)}), want{nil, 2, 0, nil, def}},
		{"invalid spec", mustEncode(t, registerModel{badSpec}), want{chunk.ErrInvalidSpec, 2, 0, nil, def}},
		{"long salt", mustEncode(t, registerModel{longSalt}), want{chunk.ErrInvalidSpec, 2, 0, nil, def}},
		{"settings", mustEncode(t, setSettings{Settings: custom}), want{nil, 2, 0, nil, custom}},
		{"settings W>R", mustEncode(t, setSettings{Settings: Settings{2, 3, chunk.CodecRaw}}), want{ErrInvalidCommand, 2, 0, nil, custom}},
		{"settings R=0", mustEncode(t, setSettings{Settings: Settings{0, 0, chunk.CodecRaw}}), want{ErrInvalidCommand, 2, 0, nil, custom}},
		{"settings codec", mustEncode(t, setSettings{Settings: Settings{1, 1, chunk.Codec(77)}}), want{ErrInvalidCommand, 2, 0, nil, custom}},
		{"ring add", mustEncode(t, ringChange{Epoch: 0, Upsert: []ring.Member{member("b"), member("a")}}), want{nil, 2, 1, []string{"a", "b"}, custom}},
		{"ring stale", mustEncode(t, ringChange{Epoch: 0, Upsert: []ring.Member{member("c")}}), want{ErrStaleEpoch, 2, 1, []string{"a", "b"}, custom}},
		{"ring no-op", mustEncode(t, ringChange{Epoch: 1, Upsert: []ring.Member{member("a")}, Remove: []string{"zz"}}), want{nil, 2, 1, []string{"a", "b"}, custom}},
		{"ring add+remove", mustEncode(t, ringChange{Epoch: 1, Upsert: []ring.Member{member("c")}, Remove: []string{"a"}}), want{nil, 2, 2, []string{"b", "c"}, custom}},
		{"ring readdress", mustEncode(t, ringChange{Epoch: 2, Upsert: []ring.Member{{ID: "b", GRPCAddr: "new"}}}), want{nil, 2, 3, []string{"b", "c"}, custom}},
		{"ring empty", mustEncode(t, ringChange{Epoch: 3}), want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"ring dup", mustEncode(t, ringChange{Epoch: 3, Upsert: []ring.Member{member("d")}, Remove: []string{"d"}}), want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"ring empty id", mustEncode(t, ringChange{Epoch: 3, Upsert: []ring.Member{{}}}), want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"ring neg weight", mustEncode(t, ringChange{Epoch: 3, Upsert: []ring.Member{{ID: "e", Weight: -1}}}), want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"empty", nil, want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"version", []byte{9, 1, '{', '}'}, want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"kind", []byte{1, 0, '{', '}'}, want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"json", []byte{1, 2, '{'}, want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
		{"json type", []byte{1, 2, '[', ']'}, want{ErrInvalidCommand, 2, 3, []string{"b", "c"}, custom}},
	}
	for i, st := range steps {
		res := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: st.cmd})
		err, _ := res.(error)
		if st.want.err == nil && err != nil || st.want.err != nil && !errors.Is(err, st.want.err) {
			t.Fatalf("%s: Apply = %v, want %v", st.name, res, st.want.err)
		}
		s := f.state()
		var got []string
		for _, m := range s.Members {
			got = append(got, m.ID)
		}
		if len(s.Models) != st.want.models || s.Epoch != st.want.epoch || !reflect.DeepEqual(got, st.want.members) || s.Settings != st.want.set {
			t.Fatalf("%s: state %+v", st.name, s)
		}
		if r := f.currentRing(); r.Epoch() != s.Epoch || r.Len() != len(s.Members) {
			t.Fatalf("%s: ring epoch %d len %d, state %d %d", st.name, r.Epoch(), r.Len(), s.Epoch, len(s.Members))
		}
	}
	if m, _ := f.member("b"); m.GRPCAddr != "new" {
		t.Fatalf("b = %+v after readdress", m)
	}
	// Non-command entries are not the FSM's business.
	if res := f.Apply(&raft.Log{Type: raft.LogNoop}); res != nil {
		t.Fatalf("noop: %v", res)
	}
}

// TestFSMLeave: a leave takes the node out of the ring (a new epoch) and
// tombstones its incarnation; a repeated leave changes nothing; a ring
// change that adds the node back clears the tombstone.
func TestFSMLeave(t *testing.T) {
	f := newFSM(nil)
	type want struct {
		err     error
		epoch   uint64
		members []string
		left    []departure
	}
	steps := []struct {
		name string
		cmd  []byte
		want want
	}{
		{"ring", mustEncode(t, ringChange{Epoch: 0, Upsert: []ring.Member{member("a"), member("b"), member("c")}}),
			want{nil, 1, []string{"a", "b", "c"}, nil}},
		{"leave b", mustEncode(t, leave{ID: "b", Incarnation: 5}), want{nil, 2, []string{"a", "c"}, []departure{{"b", 5, 0}}}},
		{"leave b again", mustEncode(t, leave{ID: "b", Incarnation: 5}), want{nil, 2, []string{"a", "c"}, []departure{{"b", 5, 0}}}},
		{"leave b other run", mustEncode(t, leave{ID: "b", Incarnation: 6}), want{nil, 2, []string{"a", "c"}, []departure{{"b", 6, 0}}}},
		{"leave non-member", mustEncode(t, leave{ID: "x", Incarnation: 1}), want{nil, 2, []string{"a", "c"}, []departure{{"b", 6, 0}, {"x", 1, 0}}}},
		{"leave empty id", mustEncode(t, leave{}), want{ErrInvalidCommand, 2, []string{"a", "c"}, []departure{{"b", 6, 0}, {"x", 1, 0}}}},
		{"b back", mustEncode(t, ringChange{Epoch: 2, Upsert: []ring.Member{member("b")}}),
			want{nil, 3, []string{"a", "b", "c"}, []departure{{"x", 1, 0}}}},
		{"x back without ring change", mustEncode(t, ringChange{Epoch: 3, Upsert: []ring.Member{member("x")}, Remove: []string{"c"}}),
			want{nil, 4, []string{"a", "b", "x"}, nil}},
	}
	for i, st := range steps {
		res := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: st.cmd})
		err, _ := res.(error)
		if st.want.err == nil && err != nil || st.want.err != nil && !errors.Is(err, st.want.err) {
			t.Fatalf("%s: Apply = %v, want %v", st.name, res, st.want.err)
		}
		s := f.state()
		var got []string
		for _, m := range s.Members {
			got = append(got, m.ID)
		}
		if s.Epoch != st.want.epoch || !reflect.DeepEqual(got, st.want.members) || !reflect.DeepEqual(s.Left, st.want.left) {
			t.Fatalf("%s: state epoch %d members %v left %v", st.name, s.Epoch, got, s.Left)
		}
		if r := f.currentRing(); r.Epoch() != s.Epoch || r.Len() != len(s.Members) {
			t.Fatalf("%s: ring epoch %d len %d, state %d %d", st.name, r.Epoch(), r.Len(), s.Epoch, len(s.Members))
		}
	}
}

type sink struct {
	bytes.Buffer
	canceled bool
}

func (s *sink) ID() string    { return "test" }
func (s *sink) Cancel() error { s.canceled = true; return nil }
func (s *sink) Close() error  { return nil }

// snapshotBytes persists f's snapshot into a sink, as raft does, and
// releases it.
func snapshotBytes(t testing.TB, f *fsm) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	var sk sink
	if err := snap.Persist(&sk); err != nil {
		t.Fatal(err)
	}
	if sk.canceled {
		t.Fatal("Persist canceled the sink")
	}
	return sk.Bytes()
}

// restoreFSM restores a new fsm, notifying onChange, from snapshot bytes.
func restoreFSM(t testing.TB, b []byte, onChange func()) *fsm {
	t.Helper()
	g := newFSM(onChange)
	if err := g.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	return g
}

// restored round-trips f through a snapshot into a new fsm and fails
// unless the new one holds the same state.
func restored(t testing.TB, f *fsm) *fsm {
	t.Helper()
	g := restoreFSM(t, snapshotBytes(t, f), nil)
	if !reflect.DeepEqual(f.state(), g.state()) {
		t.Fatalf("restored %+v, want %+v", g.state(), f.state())
	}
	return g
}

func TestSnapshotRoundTrip(t *testing.T) {
	changes := 0
	f := newFSM(func() { changes++ })
	for _, cmd := range [][]byte{
		mustEncode(t, registerModel{testSpec(1)}),
		mustEncode(t, registerModel{testSpec(2)}),
		mustEncode(t, setSettings{Settings: Settings{2, 1, chunk.CodecLossless}}),
		mustEncode(t, ringChange{Epoch: 0, Upsert: []ring.Member{member("x"), member("y"), member("z")}}),
		mustEncode(t, leave{ID: "z", Incarnation: 3}),
	} {
		if res := f.Apply(&raft.Log{Type: raft.LogCommand, Data: cmd}); res != nil {
			t.Fatal(res)
		}
	}
	if changes != 5 {
		t.Fatalf("%d change notifications, want 5", changes)
	}
	b := snapshotBytes(t, f)
	if len(b) > 4096 {
		t.Fatalf("snapshot of 2 models and 2 members is %d bytes", len(b))
	}
	g := restoreFSM(t, b, func() { changes++ })
	if !reflect.DeepEqual(f.state(), g.state()) {
		t.Fatalf("restored %+v, want %+v", g.state(), f.state())
	}
	if changes != 6 {
		t.Fatal("restore did not notify")
	}
	if inc, ok := g.departed("z"); !ok || inc != 3 {
		t.Fatalf("restored tombstone of z: %d %v", inc, ok)
	}
	for _, bad := range []string{"", "{", `{"version":2}`, `{"version":1,"settings":{}}`,
		`{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1},"members":[{"id":"a"},{"id":"a"}]}`,
		`{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1},"models":[{}]}`,
		`{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1},"left":[{"id":"a"},{"id":"a"}]}`,
		`{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1},"left":[{"id":""}]}`} {
		if err := g.Restore(io.NopCloser(bytes.NewReader([]byte(bad)))); err == nil {
			t.Fatalf("Restore(%q) accepted", bad)
		}
	}
	if !reflect.DeepEqual(f.state(), g.state()) {
		t.Fatal("a refused restore changed the state")
	}
}

func TestCommandRoundTrip(t *testing.T) {
	spec := testSpec(3)
	spec.Scaling = chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, BetaFast: 32, BetaSlow: 1, AttentionFactor: math.Pi / 3}
	spec.RotaryDim = 64
	spec.Salt = "tenant\x00é"
	_, rec := newRecord(t, "tenant é", auth.ScopeAdmin, "0123456789abcdef0123456789abcdef")
	cases := []command{
		registerModel{spec},
		setSettings{Settings: Settings{4, 2, chunk.CodecInt4}},
		ringChange{Epoch: 7, Upsert: []ring.Member{member("a")}, Remove: []string{"b"}},
		putToken{rec},
		deleteToken{rec.ID},
		leave{ID: "n3", Incarnation: 1 << 62},
	}
	for _, want := range cases {
		c, err := decodeCommand(mustEncode(t, want))
		if err != nil || !reflect.DeepEqual(c, want) {
			t.Fatalf("%v: decoded %+v, %v; want %+v", want.kind(), c, err, want)
		}
	}
	if got := cases[0].(registerModel).Spec.Fingerprint(); got != spec.Fingerprint() {
		t.Fatalf("decoded spec fingerprint %v, want %v", got, spec.Fingerprint())
	}
	if _, err := encodeCommand(ringChange{Upsert: []ring.Member{{ID: "n", Weight: math.NaN()}}}); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("NaN weight encoded: %v", err)
	}
}

// FuzzDecodeCommand: no input panics the decoder, and what it accepts
// re-encodes to a command whose encoding is a fixpoint, and applies without
// panic.
func FuzzDecodeCommand(f *testing.F) {
	f.Add(mustEncode(f, registerModel{testSpec(1)}))
	f.Add(mustEncode(f, setSettings{Settings: DefaultSettings()}))
	f.Add(mustEncode(f, ringChange{Epoch: 0, Upsert: []ring.Member{member("a")}, Remove: []string{"b"}}))
	_, rec := newRecord(f, "seed", auth.ScopeRead|auth.ScopeWrite, "a1", "ff00")
	f.Add(mustEncode(f, putToken{rec}))
	f.Add(mustEncode(f, deleteToken{rec.ID}))
	f.Add(mustEncode(f, leave{ID: "a", Incarnation: 7}))
	v := uint64(12)
	f.Add(mustEncode(f, setSettings{Settings: DefaultSettings(), IfVersion: &v}))
	f.Add(mustEncode(f, leave{ID: "a", Incarnation: 7, At: 1 << 60}))
	f.Add(mustEncode(f, ringChange{Epoch: 3, Upsert: []ring.Member{member("a")}, At: 1 << 60}))
	f.Add([]byte{1, 6, '{', '"', 'i', 'd', '"', ':', '"', '"', '}'})
	f.Add([]byte{})
	f.Add([]byte{1, 3, 'n', 'u', 'l', 'l'})
	f.Add([]byte{1, 4, '{', '}'})
	f.Add([]byte{1, 1, '{', '"', 's', 'p', 'e', 'c', '"', ':', '1', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommand(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidCommand) {
				t.Fatalf("error %v does not wrap ErrInvalidCommand", err)
			}
			return
		}
		b2, err := encodeCommand(c)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		c2, err := decodeCommand(b2)
		if err != nil || c2.kind() != c.kind() {
			t.Fatalf("re-decode %+v, %v; want %+v", c2, err, c)
		}
		// Empty and nil slices encode alike, so compare encodings.
		if b3, err := encodeCommand(c2); err != nil || !bytes.Equal(b2, b3) {
			t.Fatalf("encoding not a fixpoint: %q then %q (%v)", b2, b3, err)
		}
		fsm := newFSM(nil)
		_ = fsm.Apply(&raft.Log{Type: raft.LogCommand, Data: b})
	})
}

// FuzzRestore: no snapshot bytes panic Restore, and a refused one leaves
// the state as it was.
func FuzzRestore(f *testing.F) {
	g := newFSM(nil)
	_, rec := newRecord(f, "seed", auth.ScopeRead, "0a")
	g.reset(snapshotState{Version: snapshotVersion, Models: []chunk.ModelSpec{testSpec(1)}, Settings: DefaultSettings(), Epoch: 3,
		Members: []ring.Member{member("a")}, Tokens: []auth.Record{rec}, Left: []departure{{ID: "b", Incarnation: 9}}})
	f.Add(snapshotBytes(f, g))
	f.Add([]byte(`{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1}}`))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fsm := newFSM(nil)
		before := fsm.state()
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
			if !reflect.DeepEqual(before, fsm.state()) {
				t.Fatal("refused restore changed the state")
			}
			return
		}
		if s := fsm.state(); s.Settings.Validate() != nil || fsm.currentRing().Epoch() != s.Epoch {
			t.Fatalf("accepted bad state %+v", s)
		}
	})
}

// TestModelTable: the sharded copy-on-write table behaves like a map, and
// a version once taken never changes.
func TestModelTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tab := &modelTable{}
	ref := map[chunk.Fingerprint]chunk.ModelSpec{}
	type version struct {
		tab *modelTable
		ref map[chunk.Fingerprint]chunk.ModelSpec
	}
	var versions []version
	for i := range 2000 {
		spec := testSpec(rng.IntN(1500))
		fp := spec.Fingerprint()
		tab = tab.with(fp, spec)
		ref[fp] = spec
		if i%200 == 0 {
			versions = append(versions, version{tab, maps.Clone(ref)})
		}
	}
	versions = append(versions, version{tab, ref})
	for _, v := range versions {
		if v.tab.n != len(v.ref) {
			t.Fatalf("n = %d, want %d", v.tab.n, len(v.ref))
		}
		got := v.tab.sorted()
		if len(got) != len(v.ref) {
			t.Fatalf("sorted has %d, want %d", len(got), len(v.ref))
		}
		for i, spec := range got {
			fp := spec.Fingerprint()
			if i > 0 {
				prev := got[i-1].Fingerprint()
				if prev.Hi > fp.Hi || prev.Hi == fp.Hi && prev.Lo >= fp.Lo {
					t.Fatal("sorted out of order")
				}
			}
			if r, ok := v.ref[fp]; !ok || !reflect.DeepEqual(r, spec) {
				t.Fatalf("sorted has %v not in the reference", fp)
			}
		}
		for fp, spec := range v.ref {
			if s, ok := v.tab.get(fp); !ok || !reflect.DeepEqual(s, spec) {
				t.Fatalf("get(%v) = %v, %v", fp, s, ok)
			}
		}
	}
}

func TestFSMRegistryFull(t *testing.T) {
	f := newFSM(nil)
	st := *f.cur.Load()
	full := *st.models
	full.n = MaxModels // as if that many were registered
	st.models = &full
	f.cur.Store(&st)
	res := f.Apply(&raft.Log{Type: raft.LogCommand, Data: mustEncode(t, registerModel{testSpec(1)})})
	if err, _ := res.(error); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("registration into a full registry: %v", res)
	}
}
