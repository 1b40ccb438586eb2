package workload

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

var updatePython = flag.Bool("update-python", false, "rewrite testdata/python_mesh.json (python/tests/test_mesh.py's reference)")

// pyMesh is what python/tests/test_mesh.py checks kvmesh.serve.Mesh
// against: per method of the accuracy benchmark (kvmesh-bench -accuracy's
// RunAccuracy, on a handful of train/recall's prompts), each prompt's
// greedy answer and the match of each chunk.
type pyMesh struct {
	Prompts []int          `json:"prompts"` // indices in train/recall/eval.json
	Limit   int            `json:"limit"`   // answer tokens at most
	Stop    uint32         `json:"stop"`
	Methods []pyMeshMethod `json:"methods"`
}

type pyMeshMethod struct {
	Name      string     `json:"name"`
	Encoding  string     `json:"encoding"` // "" for full prefill
	Recompute float64    `json:"recompute"`
	Bound     float64    `json:"bound"`
	Answers   [][]uint32 `json:"answers"`
	Matches   [][]string `json:"matches"` // per prompt, per chunk segment (the system prompt first)
}

func TestPythonMeshVectors(t *testing.T) {
	e, set := recallEngine(t)
	ctx := t.Context()
	sub := handful(set, 2, []string{"facts", "rag", "twohop"}, 5, 10)
	var idx []int
	for _, p := range sub.Prompts {
		for i := range set.Prompts {
			if q := &set.Prompts[i]; q.Task == p.Task && q.K == p.K && q.Index == p.Index {
				idx = append(idx, i)
			}
		}
	}
	stores := map[Encoding]*engine.MemStore{}
	factory := func(_ context.Context, enc Encoding, codec chunk.Codec) (*engine.Engine, engine.ChunkStore, error) {
		if stores[enc] == nil {
			stores[enc] = engine.NewMemStore(codec)
		}
		return e, stores[enc], nil
	}
	cfg := AccuracyConfig{Set: sub, Recompute: []float64{0, 0.15}, Codecs: []chunk.Codec{chunk.CodecRaw},
		Selections: []engine.Selection{}, Bounds: []float64{0.5}}
	res, err := RunAccuracy(ctx, e, factory, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := pyMesh{Prompts: idx, Limit: sub.AnswerLimit(), Stop: sub.Stop}
	for mi, m := range res.Methods {
		// Prefix caching and windows have no Mesh counterpart (a window
		// here holds the system prompt and the storage order's last tokens).
		if m.Prefix || (!m.Full && m.Enc == EncWindow) {
			continue
		}
		pm := pyMeshMethod{Name: m.Name, Recompute: m.Recompute, Bound: m.Bound}
		if !m.Full {
			pm.Encoding = m.Enc.String()
		}
		for round := range res.Rounds {
			for ci := range res.Cells {
				pm.Answers = append(pm.Answers, res.Stats[ci][mi].Answers[round])
				if m.Full {
					continue
				}
				p := sub.find(res.Cells[ci].Task, res.Cells[ci].K, round)
				resp, err := e.Run(ctx, stores[m.Enc], engine.Request{Segments: p.Segments()})
				if err != nil {
					t.Fatal(err)
				}
				var ms []string
				for _, c := range resp.Chunks {
					ms = append(ms, strings.ToUpper(c.Match.String()))
				}
				pm.Matches = append(pm.Matches, ms)
			}
		}
		got.Methods = append(got.Methods, pm)
	}
	// The answers above are in round-robin order (every cell's first
	// prompt, then every cell's second): so is Prompts.
	got.Prompts = nil
	for round := range res.Rounds {
		for _, c := range res.Cells {
			p := sub.find(c.Task, c.K, round)
			got.Prompts = append(got.Prompts, slices.IndexFunc(set.Prompts, func(q EvalPrompt) bool {
				return q.Task == p.Task && q.K == p.K && q.Index == p.Index
			}))
		}
	}
	path := filepath.Join("testdata", "python_mesh.json")
	b, err := json.MarshalIndent(got, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if *updatePython {
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(b)+"\n" {
		t.Fatalf("%s is stale: go test ./workload -run TestPythonMeshVectors -args -update-python", path)
	}
}
