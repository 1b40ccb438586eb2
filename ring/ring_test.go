package ring

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("node-%02d", i), GRPCAddr: fmt.Sprintf("10.0.0.%d:7000", i+1)}
	}
	return ms
}

func ids(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// keys returns n content IDs derived as real ones are (ContentID of a
// token sequence), so the tests see the distribution placement will.
func keys(n int) []chunk.ID {
	fp := chunk.Fingerprint{Lo: 0x1234, Hi: 0x5678}
	out := make([]chunk.ID, n)
	for i := range out {
		out[i] = chunk.ContentID(fp, []uint32{uint32(i), uint32(i >> 7), 42})
	}
	return out
}

func TestDetLogMatchesMathLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	xs := []float64{0x1p-53, 0x1p-52, 1e-10, 0.25, 0.5, math.Sqrt2 / 2, 0.7071067811865476, 0.75, 0.999, 1 - 0x1p-53}
	for range 200000 {
		xs = append(xs, (float64(rng.Uint64()>>12)+0.5)*0x1p-52)
	}
	for _, x := range xs {
		got, want := detLog(x), math.Log(x)
		// Both are < 1 ulp from the true value, so they differ by at most 2 ulp.
		if d := math.Abs(got - want); d > 2*ulp(want) {
			t.Fatalf("detLog(%v) = %v, math.Log = %v (%.3g ulp apart)", x, got, want, d/ulp(want))
		}
	}
}

func ulp(x float64) float64 {
	x = math.Abs(x)
	return math.Nextafter(x, math.Inf(1)) - x
}

func TestNewIgnoresOrderAndDuplicates(t *testing.T) {
	base := members(7)
	base[3].Weight = 2.5
	ref := New(9, base)
	rng := rand.New(rand.NewPCG(3, 4))
	ks := keys(2000)
	for trial := range 20 {
		in := slices.Clone(base)
		rng.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		// Duplicates and empty IDs must not change anything either.
		in = append(in, Member{}, Member{ID: base[5].ID, GRPCAddr: "zz:1"})
		r := New(9, in)
		if !slices.Equal(r.Members(), ref.Members()) {
			t.Fatalf("trial %d: members %v, want %v", trial, r.Members(), ref.Members())
		}
		for _, k := range ks {
			if got, want := ids(r.Replicas(k, 3)), ids(ref.Replicas(k, 3)); !slices.Equal(got, want) {
				t.Fatalf("trial %d key %v: %v, want %v", trial, k, got, want)
			}
		}
	}
	if r := New(1, []Member{{ID: "b", GRPCAddr: "y"}, {ID: "b", GRPCAddr: "x"}}); r.Members()[0].GRPCAddr != "x" {
		t.Fatalf("duplicate resolution kept %+v, want the one sorting first", r.Members()[0])
	}
}

func TestReplicasEdgeCases(t *testing.T) {
	r := New(4, members(5))
	k := keys(1)[0]
	empty := New(0, nil)
	tests := []struct {
		name string
		r    *Ring
		n    int
		want int
	}{
		{"zero", r, 0, 0},
		{"negative", r, -1, 0},
		{"one", r, 1, 1},
		{"three", r, 3, 3},
		{"all", r, 5, 5},
		{"more than members", r, 9, 5},
		{"more than the stack buffer", New(1, members(20)), 12, 12},
		{"empty ring", empty, 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.r.Replicas(k, tc.n)
			if len(got) != tc.want {
				t.Fatalf("len %d, want %d", len(got), tc.want)
			}
			seen := map[string]bool{}
			for i, m := range got {
				if seen[m.ID] {
					t.Fatalf("duplicate %s", m.ID)
				}
				seen[m.ID] = true
				if rank := tc.r.ReplicaRank(k, m.ID, tc.n); rank != i {
					t.Fatalf("ReplicaRank(%s) = %d, want %d", m.ID, rank, i)
				}
			}
			for _, m := range tc.r.Members() {
				if tc.r.IsReplica(k, m.ID, tc.n) != seen[m.ID] {
					t.Fatalf("IsReplica(%s) = %v, want %v", m.ID, !seen[m.ID], seen[m.ID])
				}
			}
			if tc.r.IsReplica(k, "nobody", tc.n) {
				t.Fatal("IsReplica of a non-member")
			}
			// Every prefix of a larger set is the smaller set.
			if big := tc.r.Replicas(k, tc.n+2); len(got) > 0 && !slices.Equal(ids(big[:len(got)]), ids(got)) {
				t.Fatalf("Replicas(n+2) = %v does not extend %v", ids(big), ids(got))
			}
		})
	}
	if _, ok := empty.Owner(k); ok {
		t.Fatal("Owner on an empty ring")
	}
	if o, ok := r.Owner(k); !ok || o != r.Replicas(k, 1)[0] {
		t.Fatalf("Owner = %v, %v; want %v", o, ok, r.Replicas(k, 1)[0])
	}
	if m, ok := r.Member("node-02"); !ok || m.GRPCAddr != "10.0.0.3:7000" || !r.Contains("node-02") || r.Contains("x") {
		t.Fatalf("Member/Contains wrong: %+v %v", m, ok)
	}
	if r.Epoch() != 4 || r.Len() != 5 {
		t.Fatalf("Epoch %d Len %d", r.Epoch(), r.Len())
	}
}

func TestEffectiveWeight(t *testing.T) {
	for _, tc := range []struct{ w, want float64 }{
		{0, 1}, {-3, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {0.5, 0.5}, {64, 64},
	} {
		if got := (Member{Weight: tc.w}).EffectiveWeight(); got != tc.want {
			t.Errorf("EffectiveWeight(%v) = %v, want %v", tc.w, got, tc.want)
		}
	}
	if CapacityWeight(0) != 1.0/1024 || CapacityWeight(8*GiB) != 8 {
		t.Errorf("CapacityWeight: %v %v", CapacityWeight(0), CapacityWeight(8*GiB))
	}
}

const propKeys = 100_000

// TestJoinMovesOnlyWhatItMust checks rendezvous hashing's guarantees on a
// join: the owner changes for about 1/(N+1) of the keys and only to the new
// node, and a replica set changes only by the new node entering at its
// rank and the old last replica dropping out.
func TestJoinMovesOnlyWhatItMust(t *testing.T) {
	ks := keys(propKeys)
	const r = 3
	for _, n := range []int{3, 5, 8, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			old := New(1, members(n))
			joined := Member{ID: "joiner", GRPCAddr: "10.0.1.1:7000"}
			nw := New(2, append(members(n), joined))
			moved, setChanged := 0, 0
			for _, k := range ks {
				a, b := ids(old.Replicas(k, r)), ids(nw.Replicas(k, r))
				if a[0] != b[0] {
					moved++
					if b[0] != joined.ID {
						t.Fatalf("key %v: owner moved %s -> %s, not to the joiner", k, a[0], b[0])
					}
				}
				i := slices.Index(b, joined.ID)
				if i < 0 {
					if !slices.Equal(a, b) {
						t.Fatalf("key %v: set changed %v -> %v without the joiner", k, a, b)
					}
					continue
				}
				setChanged++
				if rest := slices.Delete(slices.Clone(b), i, i+1); !slices.Equal(rest, a[:r-1]) {
					t.Fatalf("key %v: %v -> %v is not the old set with the joiner inserted", k, a, b)
				}
			}
			checkFraction(t, "owners moved", moved, 1/float64(n+1))
			checkFraction(t, "replica sets changed", setChanged, float64(r)/float64(n+1))
		})
	}
}

// TestLeaveMovesOnlyWhatItMust is the converse: only keys the leaver held
// change, each replica set loses the leaver and gains the next in line.
func TestLeaveMovesOnlyWhatItMust(t *testing.T) {
	ks := keys(propKeys)
	const r = 3
	for _, n := range []int{4, 6, 9, 17} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			all := members(n)
			old := New(1, all)
			leaver := all[n/2].ID
			nw := New(2, slices.Delete(slices.Clone(all), n/2, n/2+1))
			moved, setChanged := 0, 0
			for _, k := range ks {
				a, b := ids(old.Replicas(k, r)), ids(nw.Replicas(k, r))
				if a[0] != b[0] {
					moved++
					if a[0] != leaver {
						t.Fatalf("key %v: owner %s -> %s although %s left", k, a[0], b[0], leaver)
					}
				}
				i := slices.Index(a, leaver)
				if i < 0 {
					if !slices.Equal(a, b) {
						t.Fatalf("key %v: set changed %v -> %v without the leaver in it", k, a, b)
					}
					continue
				}
				setChanged++
				if rest := slices.Delete(slices.Clone(a), i, i+1); !slices.Equal(rest, b[:r-1]) {
					t.Fatalf("key %v: %v -> %v is not the old set minus the leaver plus one", k, a, b)
				}
			}
			checkFraction(t, "owners moved", moved, 1/float64(n))
			checkFraction(t, "replica sets changed", setChanged, float64(r)/float64(n))
		})
	}
}

// checkFraction accepts count/propKeys within 6 standard deviations of the
// binomial around want (about ±0.6% at p = 0.2): a wrong placement is off by
// far more, and a correct one fails with probability ~1e-9.
func checkFraction(t *testing.T, what string, count int, want float64) {
	t.Helper()
	got := float64(count) / propKeys
	tol := 6 * math.Sqrt(want*(1-want)/propKeys)
	if math.Abs(got-want) > tol {
		t.Errorf("%s: %.4f of keys, want %.4f ± %.4f", what, got, want, tol)
	}
}

func TestWeightsShareKeys(t *testing.T) {
	ks := keys(propKeys)
	tests := []struct {
		name    string
		weights []float64
	}{
		{"uniform", []float64{1, 1, 1, 1}},
		{"1234", []float64{1, 2, 3, 4}},
		{"capacities", []float64{CapacityWeight(64 * GiB), CapacityWeight(16 * GiB), CapacityWeight(16 * GiB)}},
		{"one tiny", []float64{100, 100, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms := members(len(tc.weights))
			total := 0.0
			for i, w := range tc.weights {
				ms[i].Weight = w
				total += w
			}
			r := New(1, ms)
			count := map[string]int{}
			for _, k := range ks {
				o, _ := r.Owner(k)
				count[o.ID]++
			}
			for i, m := range ms {
				checkFraction(t, m.ID, count[m.ID], tc.weights[i]/total)
			}
		})
	}
}

// TestWeightChangeMovesOnlyThatNode: raising one node's weight moves keys
// only onto it, lowering it only off it.
func TestWeightChangeMovesOnlyThatNode(t *testing.T) {
	ks := keys(propKeys)
	ms := members(5)
	old := New(1, ms)
	for _, w := range []float64{3, 0.25} {
		ch := slices.Clone(ms)
		ch[2].Weight = w
		nw := New(2, ch)
		moved := 0
		for _, k := range ks {
			a, _ := old.Owner(k)
			b, _ := nw.Owner(k)
			if a.ID == b.ID {
				continue
			}
			moved++
			if (w > 1 && b.ID != ms[2].ID) || (w < 1 && a.ID != ms[2].ID) {
				t.Fatalf("weight %v: key %v moved %s -> %s", w, k, a.ID, b.ID)
			}
		}
		// Node 2's share goes from 1/5 to w/(4+w).
		checkFraction(t, fmt.Sprintf("moved at weight %v", w), moved, math.Abs(w/(4+w)-0.2))
	}
}

// Golden files pin the placement function itself: a change to the hash,
// the score or the tie-break would silently reshuffle every cluster's data
// on upgrade, so it must show up as a diff here.
func TestGolden(t *testing.T) {
	weighted := members(6)
	for i := range weighted {
		weighted[i].Weight = float64(i%3 + 1)
	}
	tests := []struct {
		name    string
		members []Member
		r       int
	}{
		{"uniform3_r3", members(3), 3},
		{"uniform5_r3", members(5), 3},
		{"weighted6_r2", weighted, 2},
		{"uniform16_r5", members(16), 5},
	}
	fp := chunk.Fingerprint{Lo: 1, Hi: 2}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(7, tc.members)
			var b strings.Builder
			fmt.Fprintf(&b, "# members %s r=%d\n", strings.Join(ids(r.Members()), ","), tc.r)
			for i := range 64 {
				k := chunk.ContentID(fp, []uint32{uint32(i)})
				if i >= 60 {
					k = chunk.ID{Lo: uint64(i - 60)} // degenerate IDs too
				}
				fmt.Fprintf(&b, "%s %s\n", k, strings.Join(ids(r.Replicas(k, tc.r)), ","))
			}
			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./ring -run TestGolden -update to create)", err)
			}
			if got := b.String(); got != string(want) {
				diffLines(t, got, string(want))
			}
		})
	}
}

func diffLines(t *testing.T, got, want string) {
	t.Helper()
	g := bufio.NewScanner(strings.NewReader(got))
	w := bufio.NewScanner(strings.NewReader(want))
	for line := 1; ; line++ {
		gok, wok := g.Scan(), w.Scan()
		if !gok && !wok {
			return
		}
		if g.Text() != w.Text() {
			t.Fatalf("placement changed at line %d:\n got  %q\n want %q", line, g.Text(), w.Text())
		}
	}
}

func TestAppendReplicasDoesNotAllocate(t *testing.T) {
	r := New(1, members(32))
	ks := keys(64)
	dst := make([]Member, 0, 8)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		dst = r.AppendReplicas(dst[:0], ks[i%len(ks)], 3)
		i++
	})
	if allocs != 0 {
		t.Fatalf("AppendReplicas allocates %v times per call", allocs)
	}
	allocs = testing.AllocsPerRun(1000, func() {
		_ = r.IsReplica(ks[i%len(ks)], "node-07", 3)
		_, _ = r.Owner(ks[i%len(ks)])
		i++
	})
	if allocs != 0 {
		t.Fatalf("IsReplica/Owner allocate %v times per call", allocs)
	}
}

func BenchmarkReplicas(b *testing.B) {
	ks := keys(1024)
	for _, n := range []int{3, 16, 128} {
		r := New(1, members(n))
		b.Run(fmt.Sprintf("members=%d/r=3", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_ = r.Replicas(ks[i&1023], 3)
				i++
			}
		})
		b.Run(fmt.Sprintf("members=%d/r=3/append", n), func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]Member, 0, 3)
			i := 0
			for b.Loop() {
				dst = r.AppendReplicas(dst[:0], ks[i&1023], 3)
				i++
			}
		})
	}
}

func BenchmarkReplicasWeighted(b *testing.B) {
	ks := keys(1024)
	for _, n := range []int{3, 16, 128} {
		ms := members(n)
		for i := range ms {
			ms[i].Weight = float64(1 + i%4)
		}
		r := New(1, ms)
		b.Run(fmt.Sprintf("members=%d/r=3/append", n), func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]Member, 0, 3)
			i := 0
			for b.Loop() {
				dst = r.AppendReplicas(dst[:0], ks[i&1023], 3)
				i++
			}
		})
	}
}

func BenchmarkNew(b *testing.B) {
	ms := members(128)
	b.ReportAllocs()
	for b.Loop() {
		_ = New(1, ms)
	}
}

// TestUniformShortcutMatchesScore: with equal weights Ring skips the
// logarithm and orders by hash; that must give the placement the weighted
// score would.
func TestUniformShortcutMatchesScore(t *testing.T) {
	for _, n := range []int{2, 5, 33} {
		fast := New(1, members(n))
		slow := New(1, members(n))
		slow.uniform = false
		if !fast.uniform {
			t.Fatal("equal weights not detected as uniform")
		}
		for _, k := range keys(20000) {
			if a, b := ids(fast.Replicas(k, n)), ids(slow.Replicas(k, n)); !slices.Equal(a, b) {
				t.Fatalf("n=%d key %v: hash order %v, score order %v", n, k, a, b)
			}
		}
	}
}

func TestDigest(t *testing.T) {
	base := members(4)
	d := New(3, base).Digest()
	rev := slices.Clone(base)
	slices.Reverse(rev)
	if New(3, rev).Digest() != d {
		t.Fatal("digest depends on input order")
	}
	changed := func(f func([]Member)) []Member {
		ms := slices.Clone(base)
		f(ms)
		return ms
	}
	for name, r := range map[string]*Ring{
		"epoch":  New(4, base),
		"member": New(3, base[:3]),
		"addr":   New(3, changed(func(ms []Member) { ms[1].GRPCAddr = "x:1" })),
		"weight": New(3, changed(func(ms []Member) { ms[2].Weight = 2 })),
		"empty":  New(3, nil),
	} {
		if r.Digest() == d {
			t.Errorf("digest ignores a change of %s", name)
		}
	}
}

// TestConcurrentUse: a Ring is read from many goroutines at once (run
// with -race).
func TestConcurrentUse(t *testing.T) {
	r := New(1, members(9))
	ks := keys(500)
	want := make([][]string, len(ks))
	for i, k := range ks {
		want[i] = ids(r.Replicas(k, 3))
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i, k := range ks {
				if got := ids(r.Replicas(k, 3)); !slices.Equal(got, want[i]) {
					errs <- fmt.Errorf("goroutine %d key %d: %v, want %v", g, i, got, want[i])
					return
				}
				_ = r.IsReplica(k, "node-03", 3)
				_ = r.Members()
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
