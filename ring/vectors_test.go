package ring

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// Placement vectors shared with other implementations of the placement
// rule (docs/PLACEMENT.md; python/tests/test_vectors.py reads the same
// file): for each ring, the replica set of every key. Unlike the .golden
// files they carry each member's weight, as its IEEE-754 bits so that
// every value (NaN, infinities) survives JSON. Rewrite them with
// `go test ./ring -run TestPlacementVectors -update`.
type placementVectors struct {
	Comment string            `json:"comment"`
	Rings   []placementVector `json:"rings"`
}

type placementVector struct {
	Name    string `json:"name"`
	Members []struct {
		ID         string `json:"id"`
		WeightBits string `json:"weight_bits"`
	} `json:"members"`
	R    int `json:"r"`
	Keys []struct {
		Content  string   `json:"content"`
		Replicas []string `json:"replicas"`
	} `json:"keys"`
}

func placementRings() []struct {
	name    string
	members []Member
	r       int
} {
	weighted := members(7)
	for i, w := range []float64{1, 2, 0.5, 3.75, CapacityWeight(64 << 20), 100, 1} {
		weighted[i].Weight = w
	}
	odd := []Member{{ID: "a", Weight: 0}, {ID: "b", Weight: -3}, {ID: "c", Weight: math.NaN()},
		{ID: "d", Weight: math.Inf(1)}, {ID: "e", Weight: 2}, {ID: "ü-node", Weight: 1}}
	return []struct {
		name    string
		members []Member
		r       int
	}{
		{"single", members(1), 3},
		{"uniform3_r3", members(3), 3},
		{"uniform5_r2", members(5), 2},
		{"uniform16_r3", members(16), 3},
		{"weighted7_r3", weighted, 3},
		{"odd_weights_r2", odd, 2},
	}
}

// placementKeys are content IDs as clients derive them, and a few
// degenerate ones.
func placementKeys() []chunk.ID {
	fp := chunk.Fingerprint{Lo: 0x1234, Hi: 0x5678}
	var out []chunk.ID
	for i := range 96 {
		out = append(out, chunk.ContentID(fp, []uint32{uint32(i), 7}))
	}
	return append(out, chunk.ID{}, chunk.ID{Lo: 1}, chunk.ID{Hi: 1}, chunk.ID{Lo: math.MaxUint64, Hi: math.MaxUint64})
}

func TestPlacementVectors(t *testing.T) {
	path := filepath.Join("testdata", "placement_vectors.json")
	var want placementVectors
	if *update {
		want.Comment = "Written by `go test ./ring -run TestPlacementVectors -update`; the rule is docs/PLACEMENT.md."
		for _, rc := range placementRings() {
			pv := placementVector{Name: rc.name, R: rc.r}
			for _, m := range rc.members {
				pv.Members = append(pv.Members, struct {
					ID         string `json:"id"`
					WeightBits string `json:"weight_bits"`
				}{m.ID, fmt.Sprintf("%016x", math.Float64bits(m.Weight))})
			}
			r := New(1, rc.members)
			for _, k := range placementKeys() {
				pv.Keys = append(pv.Keys, struct {
					Content  string   `json:"content"`
					Replicas []string `json:"replicas"`
				}{k.String(), ids(r.Replicas(k, rc.r))})
			}
			want.Rings = append(want.Rings, pv)
		}
		b, err := json.MarshalIndent(want, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ring -run TestPlacementVectors -update to create)", err)
	}
	want = placementVectors{}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Rings) == 0 {
		t.Fatal("no rings in the placement vectors")
	}
	for _, pv := range want.Rings {
		var ms []Member
		for _, m := range pv.Members {
			var bits uint64
			if _, err := fmt.Sscanf(m.WeightBits, "%x", &bits); err != nil {
				t.Fatal(err)
			}
			ms = append(ms, Member{ID: m.ID, Weight: math.Float64frombits(bits)})
		}
		r := New(1, ms)
		for _, k := range pv.Keys {
			var id chunk.ID
			if _, err := fmt.Sscanf(k.Content[:16], "%x", &id.Hi); err != nil {
				t.Fatal(err)
			}
			if _, err := fmt.Sscanf(k.Content[16:], "%x", &id.Lo); err != nil {
				t.Fatal(err)
			}
			if got := ids(r.Replicas(id, pv.R)); fmt.Sprint(got) != fmt.Sprint(k.Replicas) {
				t.Errorf("%s: replicas of %s are %v, want %v", pv.Name, k.Content, got, k.Replicas)
			}
		}
	}
}
