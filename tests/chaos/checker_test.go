package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// The checker must be right before the chaos run means anything: these
// feed it histories with known answers.

func TestCheck(t *testing.T) {
	blob := []byte("written")
	keys := []KeyCheck{
		{Index: 0, Blob: blob, Holders: 3}, // read back: fine
		{Index: 1, Blob: blob, Holders: 2}, // other bytes: wrong
		{Index: 2, Blob: blob, Holders: 2}, // unreadable, W survived: lost
		{Index: 3, Blob: blob, Holders: 1}, // unreadable, < W survived: unprotected
		{Index: 4, Blob: blob, Holders: 0}, // never read at all, none survived
		{Index: 5, Blob: blob, Holders: 0}, // wrong bytes even without holders
	}
	reads := map[int]ReadResult{
		0: {Got: []byte("written")},
		1: {Got: []byte("writteN")},
		2: {Err: errors.New("not found")},
		3: {Err: errors.New("not found")},
		5: {Got: []byte("x")},
	}
	for _, tc := range []struct {
		name                     string
		w                        int
		lost, wrong, unprotected []int
	}{
		{"W=2", 2, []int{2}, []int{1, 5}, []int{3, 4}},
		{"W=1", 1, []int{2, 3}, []int{1, 5}, []int{4}},
		{"W=3", 3, nil, []int{1, 5}, []int{2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Check(keys, reads, tc.w)
			if !slices.Equal(v.Lost, tc.lost) || !slices.Equal(v.Wrong, tc.wrong) || !slices.Equal(v.Unprotected, tc.unprotected) {
				t.Fatalf("got lost %v wrong %v unprotected %v, want %v %v %v", v.Lost, v.Wrong, v.Unprotected, tc.lost, tc.wrong, tc.unprotected)
			}
		})
	}
}

func TestHolders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		run     func(h *History)
		holders int
	}{
		{"acked on three", func(h *History) {
			h.Acked(0, []string{"a", "b", "c"}, h.Generations())
		}, 3},
		{"restart empties a holder", func(h *History) {
			h.Acked(0, []string{"a", "b", "c"}, h.Generations())
			h.Restarted("b")
		}, 2},
		{"restart during the put does not count", func(h *History) {
			gen := h.Generations()
			h.Restarted("a")
			h.Acked(0, []string{"a", "b"}, gen)
		}, 1},
		{"a sweep refills", func(h *History) {
			h.Acked(0, []string{"a", "b"}, h.Generations())
			h.Restarted("a")
			h.Holds(0, "a", h.Generations()["a"])
			h.Holds(0, "c", h.Generations()["c"])
		}, 3},
		{"a sweep from before a restart does not", func(h *History) {
			gen := h.Generations()
			h.Restarted("c")
			h.Holds(0, "c", gen["c"])
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory(time.Now())
			h.Attempt(0, chunk.Key{}, []byte("x"))
			tc.run(h)
			got := h.AllKeys()[0].Holders
			if got != tc.holders {
				t.Fatalf("holders %d, want %d", got, tc.holders)
			}
		})
	}
}

func TestAgreeViews(t *testing.T) {
	for _, tc := range []struct {
		name   string
		views  map[string]string
		models map[string][]string
		want   []string
		agree  bool
	}{
		{"agree", map[string]string{"a": "e1", "b": "e1"}, map[string][]string{"a": {"m1", "m2"}, "b": {"m1", "m2"}}, []string{"m1"}, true},
		{"views differ", map[string]string{"a": "e1", "b": "e2"}, map[string][]string{"a": {"m1"}, "b": {"m1"}}, []string{"m1"}, false},
		{"acknowledged model missing", map[string]string{"a": "e1", "b": "e1"}, map[string][]string{"a": {"m1"}, "b": {"m2"}}, []string{"m1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := AgreeViews(tc.views, tc.models, tc.want)
			if (d == "") != tc.agree {
				t.Fatalf("AgreeViews = %q, want agreement %v", d, tc.agree)
			}
		})
	}
}

func TestPercentiles(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		in       []time.Duration
		p50, max time.Duration
	}{
		{nil, 0, 0},
		{[]time.Duration{3 * s}, 3 * s, 3 * s},
		{[]time.Duration{4 * s, 1 * s, 3 * s, 2 * s}, 2 * s, 4 * s},
		{[]time.Duration{5 * s, 1 * s, 3 * s}, 3 * s, 5 * s},
	} {
		if p50, max := Percentiles(tc.in); p50 != tc.p50 || max != tc.max {
			t.Errorf("Percentiles(%v) = %v %v, want %v %v", tc.in, p50, max, tc.p50, tc.max)
		}
	}
}

// Entries are a pure function of seed and index, so a replayed seed
// writes the same bytes and absent (negative) keys never collide.
func TestEntryFor(t *testing.T) {
	k1, b1, err := entryFor(7, 3)
	if err != nil {
		t.Fatal(err)
	}
	k2, b2, _ := entryFor(7, 3)
	k3, _, _ := entryFor(7, -3)
	k4, _, _ := entryFor(8, 3)
	if k1 != k2 || !slices.Equal(b1, b2) {
		t.Fatal("entryFor is not deterministic")
	}
	if k1 == k3 || k1 == k4 {
		t.Fatal("entryFor repeats keys across indexes or seeds")
	}
}

// nodeWrite does what a node does for chunk j of in: it rotates blob's
// tokens to pos.. and scatters them into the chunk's slots of mem.
func nodeWrite(t *testing.T, x *expecter, mem [][]byte, in *injection, j int, blob []byte, pos int) {
	t.Helper()
	e, err := chunk.Decode(blob, chunk.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	job := cudakern.Job{Rope: x.rope, Src: e.KV, SrcDType: e.DType, Tokens: len(e.Tokens), SrcHeads: e.KVHeads,
		HeadLo: in.headLo, HeadHi: in.headHi, Pos: pos, Slots: in.chunks[j].slots, Layout: in.lay, Dst: mem}
	if err := x.kern.Inject(t.Context(), &job); err != nil {
		t.Fatal(err)
	}
}

// TestCheckInjection feeds the injection checker answers and cache
// contents with known verdicts, on every node's cache geometry.
func TestCheckInjection(t *testing.T) {
	x, err := newExpecter()
	if err != nil {
		t.Fatal(err)
	}
	defer x.close()
	const seed = 11
	written := make(map[chunk.Key][]byte)
	for _, i := range []int{0, 3, variantBase + 3, 4} {
		k, b, err := entryFor(seed, i)
		if err != nil {
			t.Fatal(err)
		}
		written[k] = b
	}
	entry := func(k chunk.Key) []byte { return written[k] }
	own := func(i int) injChunk {
		e, _ := entryOf(seed, i)
		return injChunk{key: e.Key, tokens: e.Tokens, pos: 1000 + i, what: "own"}
	}
	other := own(4)
	other.key.Context = chunk.WindowContext(other.key.Fingerprint, windowW, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	variantWanted := own(3)
	variantWanted.key = own(variantBase + 3).key // wants the window context
	ghost := own(-5)

	E, A, M := chunk.MatchExact, chunk.MatchApproximate, chunk.MatchMiss
	type answer struct {
		m  chunk.Match
		cx chunk.Context
	}
	for _, tc := range []struct {
		name   string
		chunks []injChunk
		// answers, and which entry (nil: none) the "node" writes for
		// each chunk and at which position offset.
		answers []answer
		writes  []chunk.Key
		posOff  []int
		mutate  func(mem [][]byte, in *injection)
		// skip: token 0 of chunk 0 is skipped (-1) before the node
		// writes (honoured) or after (the node wrote it anyway).
		skip string
		want InjectTally
	}{
		{name: "exact", chunks: []injChunk{own(0), own(3)},
			answers: []answer{{E, chunk.StandaloneContext()}, {E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(0).key, own(3).key},
			want:    InjectTally{Injections: 1, Exact: 2}},
		{name: "exact variant, approximate other window, miss ghost", chunks: []injChunk{variantWanted, other, ghost},
			answers: []answer{{E, variantWanted.key.Context}, {A, chunk.StandaloneContext()}, {M, chunk.Context{}}},
			writes:  []chunk.Key{variantWanted.key, own(4).key, {}},
			want:    InjectTally{Injections: 1, Exact: 1, Approx: 1, Miss: 1}},
		{name: "approximate over an acknowledged exact entry is counted", chunks: []injChunk{func() injChunk {
			c := variantWanted
			c.exactAcked = true
			return c
		}()},
			answers: []answer{{A, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(3).key},
			want:    InjectTally{Injections: 1, Approx: 1, ApproxOverExact: 1}},
		{name: "rotated to the wrong position", chunks: []injChunk{own(0)},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(0).key}, posOff: []int{1},
			want: InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
		{name: "exact with another context", chunks: []injChunk{variantWanted},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(3).key},
			want:    InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
		{name: "approximate with the wanted context", chunks: []injChunk{own(0)},
			answers: []answer{{A, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(0).key},
			want:    InjectTally{Injections: 1, Approx: 1, Wrong: 1}},
		{name: "exact for content never written", chunks: []injChunk{ghost},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{{}},
			want:    InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
		{name: "approximate with a context never written", chunks: []injChunk{other},
			answers: []answer{{A, variantWanted.key.Context}},
			writes:  []chunk.Key{{}},
			want:    InjectTally{Injections: 1, Approx: 1, Wrong: 1}},
		{name: "another entry's bytes", chunks: []injChunk{own(3)},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{variantWanted.key},
			want:    InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
		{name: "miss that wrote", chunks: []injChunk{own(0)},
			answers: []answer{{M, chunk.Context{}}},
			writes:  []chunk.Key{own(0).key},
			want:    InjectTally{Injections: 1, Miss: 1, Wrong: 1}},
		{name: "fence written", chunks: []injChunk{own(0)},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(0).key},
			mutate: func(mem [][]byte, in *injection) {
				named := make(map[int]bool)
				for _, c := range in.chunks {
					for _, s := range c.slots {
						named[s] = true
					}
				}
				for _, s := range in.region { // a region has a fence at least
					if !named[s] {
						mem[2][in.lay.Offset(1, s, in.lay.KVHeads-1)+3] ^= 1
						return
					}
				}
				panic("no fence")
			},
			want: InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
		{name: "skipped token not written", chunks: []injChunk{own(3)},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(3).key}, skip: "before",
			want: InjectTally{Injections: 1, Exact: 1}},
		{name: "skipped token written", chunks: []injChunk{own(3)},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(3).key}, skip: "after",
			want: InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
		{name: "one bit of one V", chunks: []injChunk{own(3)},
			answers: []answer{{E, chunk.StandaloneContext()}},
			writes:  []chunk.Key{own(3).key},
			mutate: func(mem [][]byte, in *injection) {
				s := in.chunks[0].slots[1]
				mem[3][in.lay.Offset(1, s, 0)] ^= 0x80
			},
			want: InjectTally{Injections: 1, Exact: 1, Wrong: 1}},
	} {
		for node := range nodes {
			lay, lo, hi := injLayout(node)
			t.Run(fmt.Sprintf("%s/%v-%v-heads%d", tc.name, lay.Order, lay.DType, lay.KVHeads), func(t *testing.T) {
				lay.NumBlocks = 8
				c := &engineCache{lay: lay, headLo: lo, headHi: hi}
				mem := make([][]byte, baseSpec().Layers)
				for l := range mem {
					mem[l] = make([]byte, lay.LayerBytes())
				}
				rig := &injectRig{x: x}
				c.next = 5 // a region not at slot 0
				chunks := slices.Clone(tc.chunks)
				in := rig.newInjection(seed, c, rand.New(rand.NewPCG(1, uint64(node))), chunks, 0)
				fillGuard(mem, in)
				if tc.skip == "before" {
					in.chunks[0].slots[0] = -1
				}
				res := make([]pagedkv.InjectResult, len(tc.answers))
				for j, a := range tc.answers {
					res[j] = pagedkv.InjectResult{Match: a.m, Context: a.cx}
					if k := tc.writes[j]; k != (chunk.Key{}) {
						off := 0
						if tc.posOff != nil {
							off = tc.posOff[j]
						}
						nodeWrite(t, x, mem, in, j, written[k], in.chunks[j].pos+off)
					}
				}
				if tc.skip == "after" {
					in.chunks[0].slots[0] = -1
				}
				if tc.mutate != nil {
					tc.mutate(mem, in)
				}
				got, lines := checkInjection(in, res, mem, entry, x)
				if got != tc.want {
					t.Fatalf("tally %+v, want %+v (%v)", got, tc.want, lines)
				}
				if len(lines) != got.Wrong {
					t.Fatalf("%d lines for %d wrong: %v", len(lines), got.Wrong, lines)
				}
			})
		}
	}
}
