package chaos

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
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
