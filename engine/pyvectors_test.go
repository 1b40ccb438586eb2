package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

var updatePython = flag.Bool("update-python", false, "rewrite testdata/python_logits.json (python/tests/test_llama.py's reference)")

// pyVectors is what python/tests/test_llama.py checks kvmesh.torch.LlamaModel
// against: the engine's next-token logits and greedy continuations on the
// random-weight variants the engine's tests use (the Python test rebuilds
// the weights from the same seed: RandomTensors' PCG stream) and on the
// trained recall model.
type pyVectors struct {
	Seed   uint64     `json:"seed"`
	Models []pyVector `json:"models"`
}

type pyVector struct {
	Name     string          `json:"name"`
	Config   json.RawMessage `json:"config,omitempty"` // random variants; the recall model is train/recall
	Revision string          `json:"revision"`         // the engine's WeightsRevision
	Prompts  []pyPrompt      `json:"prompts"`
}

type pyPrompt struct {
	Tokens    []uint32  `json:"tokens"`
	Logits    []float32 `json:"logits"`
	Generated []uint32  `json:"generated"`
}

const pySeed = 7

func TestPythonVectors(t *testing.T) {
	ctx := context.Background()
	var got pyVectors
	got.Seed = pySeed
	names := make([]string, 0)
	vs := variants()
	for n := range vs {
		names = append(names, n)
	}
	sort.Strings(names)
	prompt := func(e *Engine, toks []uint32) pyPrompt {
		s, err := e.NewSequence(0)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release()
		logits, err := s.Append(ctx, toks)
		if err != nil {
			t.Fatal(err)
		}
		logits = slices.Clone(logits)
		gen, err := s.Generate(ctx, nil, 6)
		if err != nil {
			t.Fatal(err)
		}
		return pyPrompt{Tokens: toks, Logits: logits, Generated: gen}
	}
	for _, n := range names {
		c := vs[n]
		e := newTestEngine(t, c, pySeed)
		js, err := MarshalConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, js); err != nil {
			t.Fatal(err)
		}
		v := pyVector{Name: n, Config: compact.Bytes(), Revision: e.w.Revision}
		r := rand.New(rand.NewPCG(1, 2))
		for _, m := range []int{1, 37} {
			v.Prompts = append(v.Prompts, prompt(e, randTokens(r, m, c.VocabSize)))
		}
		got.Models = append(got.Models, v)
		e.Close()
	}
	w, err := LoadWeights(filepath.Join("..", "train", "recall"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(w, Config{Workers: 2, CacheTokens: 2048})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var set struct {
		Prompts []struct {
			System, Question []uint32
			Chunks           [][]uint32
		}
	}
	data, err := os.ReadFile(filepath.Join("..", "train", "recall", "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &set); err != nil {
		t.Fatal(err)
	}
	v := pyVector{Name: "train/recall", Revision: w.Revision}
	for _, i := range []int{0, 200, 300} { // facts, rag and two-hop prompts
		p := set.Prompts[i]
		toks := slices.Clone(p.System)
		for _, c := range p.Chunks {
			toks = append(toks, c...)
		}
		v.Prompts = append(v.Prompts, prompt(e, append(toks, p.Question...)))
	}
	got.Models = append(got.Models, v)

	path := filepath.Join("testdata", "python_logits.json")
	if *updatePython {
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want pyVectors
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	// Stale when anything but float32 summation order (assembly or pure
	// Go kernels) changed: rerun with -update-python.
	if len(want.Models) != len(got.Models) || want.Seed != got.Seed {
		t.Fatalf("%s is stale (%d models, want %d): go test ./engine -run TestPythonVectors -update-python", path, len(want.Models), len(got.Models))
	}
	for i, g := range got.Models {
		w := want.Models[i]
		if w.Name != g.Name || w.Revision != g.Revision || string(w.Config) != string(g.Config) || len(w.Prompts) != len(g.Prompts) {
			t.Fatalf("%s: model %s is stale: go test ./engine -run TestPythonVectors -update-python", path, g.Name)
		}
		for j, p := range g.Prompts {
			q := w.Prompts[j]
			if !slices.Equal(p.Tokens, q.Tokens) || !slices.Equal(p.Generated, q.Generated) {
				t.Errorf("%s prompt %d: tokens or continuation changed", g.Name, j)
			}
			for k := range p.Logits {
				if d := math.Abs(float64(p.Logits[k] - q.Logits[k])); d > 1e-4 {
					t.Fatalf("%s prompt %d: logit %d is %v, file has %v", g.Name, j, k, p.Logits[k], q.Logits[k])
				}
			}
		}
	}
}
