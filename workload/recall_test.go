package workload

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// recallDir holds the committed trained model (train/README.md).
var recallDir = filepath.Join("..", "train", "recall")

func recallEngine(t *testing.T) (*engine.Engine, *EvalSet) {
	t.Helper()
	w, err := engine.LoadWeights(recallDir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(w, engine.Config{CacheTokens: 2048})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	set, err := LoadEvalSet(filepath.Join(recallDir, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	return e, set
}

// handful is the first n prompts of each task at each of ks.
func handful(set *EvalSet, n int, tasks []string, ks ...int) *EvalSet {
	out := &EvalSet{Seed: set.Seed, Stop: set.Stop}
	count := map[Cell]int{}
	for _, p := range set.Prompts {
		c := Cell{p.Task, p.K}
		for _, task := range tasks {
			for _, k := range ks {
				if c == (Cell{task, k}) && count[c] < n {
					count[c]++
					out.Prompts = append(out.Prompts, p)
				}
			}
		}
	}
	return out
}

// The committed weights load in the engine and give PyTorch's logits and
// greedy answers on held-out questions (people and entities never seen in
// training).
func TestRecallModelAnswersHeldOut(t *testing.T) {
	e, set := recallEngine(t)
	ctx := t.Context()
	ref, err := LoadTorchReference(filepath.Join(recallDir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ref.Logits) == 0 {
		t.Fatal("reference.json has no logits")
	}
	for _, r := range ref.Logits {
		s, err := e.NewSequence(0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Append(ctx, r.Tokens)
		s.Release()
		if err != nil {
			t.Fatal(err)
		}
		var diff float64
		for i := range got {
			diff = math.Max(diff, math.Abs(float64(got[i])-float64(r.Logits[i])))
		}
		if diff > 1e-3 {
			t.Errorf("%s k=%d: engine logits differ from PyTorch's by up to %g", r.Task, r.K, diff)
		}
	}
	// The engine answers the handful of held-out questions PyTorch
	// answered, greedily, as PyTorch did; how many are right is the model's
	// business (docs/bench/ACCURACY.md), logged here.
	if len(ref.Answers) == 0 {
		t.Fatal("reference.json has no answers")
	}
	correct := 0
	for _, a := range ref.Answers {
		p := set.find(a.Task, a.K, a.Index)
		if p == nil {
			t.Fatalf("no prompt %s k=%d #%d in the evaluation set", a.Task, a.K, a.Index)
		}
		resp, err := e.Run(ctx, nil, engine.Request{Segments: p.Segments(), Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		ans, err := Decode(ctx, resp, set.Stop, set.AnswerLimit())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ans, a.Answer) {
			t.Errorf("%s k=%d #%d: engine answered %v, PyTorch %v", a.Task, a.K, a.Index, ans, a.Answer)
		}
		if p.Correct(ans) {
			correct++
		}
	}
	t.Logf("%d of %d held-out answers right", correct, len(ref.Answers))
}

// On the trained model, EXACT hits give full prefill's answers and logits
// bit for bit, and the lossless codec gives raw's answers.
func TestRecallExactReuseKeepsAnswers(t *testing.T) {
	e, set := recallEngine(t)
	ctx := t.Context()
	stores := func(ctx context.Context, enc Encoding, codec chunk.Codec) (*engine.Engine, engine.ChunkStore, error) {
		return e, engine.NewMemStore(codec), nil
	}
	cfg := AccuracyConfig{Set: handful(set, 1, []string{"facts", "rag", "twohop"}, 5), Recompute: []float64{0.15},
		Codecs: []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless}}
	res, err := RunAccuracy(ctx, e, stores, cfg)
	if err != nil {
		t.Fatal(err)
	}
	find := func(name string) int {
		for i, m := range res.Methods {
			if m.Name == name {
				return i
			}
		}
		t.Fatalf("no method %q", name)
		return -1
	}
	raw, lossless := find("kvmesh EXACT, raw"), find("kvmesh EXACT, lossless")
	for ci, c := range res.Cells {
		for _, m := range []int{raw, lossless} {
			s := &res.Stats[ci][m]
			if s.SameAsFull != s.N() || s.Fid.MaxLogit != 0 || s.Exact == 0 || s.Approx+s.Miss != 0 {
				t.Errorf("%s k=%d %s: %d of %d answers as full prefill, max logit diff %g, hits %s",
					c.Task, c.K, res.Methods[m].Name, s.SameAsFull, s.N(), s.Fid.MaxLogit, kinds(&s.Stats))
			}
		}
		for mi, me := range res.Methods {
			if me.Enc != EncExact && !me.Full && !me.Prefix && res.Stats[ci][mi].Approx == 0 {
				t.Errorf("%s k=%d %s: no APPROXIMATE hit", c.Task, c.K, me.Name)
			}
		}
	}
}

// A time budget cuts the run between rounds: every cell keeps the same
// number of prompts, and every way answered the same prompts in the same
// order (what the paired comparisons rely on).
func TestAccuracyBudgetCutsRounds(t *testing.T) {
	e, set := recallEngine(t)
	stores := func(ctx context.Context, enc Encoding, codec chunk.Codec) (*engine.Engine, engine.ChunkStore, error) {
		return e, engine.NewMemStore(codec), nil
	}
	cfg := AccuracyConfig{Set: handful(set, 3, []string{"facts", "twohop"}, 5), Recompute: []float64{0.15},
		Codecs: []chunk.Codec{chunk.CodecRaw}, Bounds: []float64{1e-9}, Budget: time.Nanosecond}
	res, err := RunAccuracy(t.Context(), e, stores, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Budgeted || res.Rounds != 1 || len(res.Cells) != 2 {
		t.Fatalf("budgeted %v after %d rounds over %d cells, want a cut after 1 round over 2", res.Budgeted, res.Rounds, len(res.Cells))
	}
	for ci, c := range res.Cells {
		for mi, m := range res.Methods {
			s := &res.Stats[ci][mi]
			if s.N() != 1 || len(s.Right) != 1 || len(s.Answers) != 1 || s.Right[0] != set.find(c.Task, c.K, 0).Correct(s.Answers[0]) {
				t.Fatalf("%v %s: %d prompts, answers %v right %v", c, m.Name, s.N(), s.Answers, s.Right)
			}
			// A bound below every deviation recomputes every chunk:
			// full prefill's answer.
			if m.Bound > 0 && (s.SameAsFull != 1 || s.Fallbacks != s.Approx) {
				t.Fatalf("%v %s: %d same as full, %d of %d chunks recomputed whole", c, m.Name, s.SameAsFull, s.Fallbacks, s.Approx)
			}
		}
	}
}

// recallFloor is train/recall/test_floor.json: how many of a fixed handful
// of held-out prompts the committed model must answer right.
type recallFloor struct {
	PromptsPerCell int `json:"prompts_per_cell"` // the first n of every task and k
	Measured       int `json:"measured_correct"` // what the model got when it was committed
	MinCorrect     int `json:"min_correct"`      // Measured minus a margin
}

// The committed weights answer held-out questions (people and entities
// never seen in training) with the accuracy they were committed with: the
// first few prompts of every task and k, by full prefill, against the
// expected answers of eval.json. The bound lives next to the model, so a
// retrained model brings its own.
func TestRecallModelAccuracyFloor(t *testing.T) {
	e, set := recallEngine(t)
	ctx := t.Context()
	data, err := os.ReadFile(filepath.Join(recallDir, "test_floor.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f recallFloor
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if f.PromptsPerCell <= 0 || f.MinCorrect <= 0 || f.MinCorrect > f.Measured {
		t.Fatalf("test_floor.json: %+v", f)
	}
	right, n := 0, 0
	for _, p := range handful(set, f.PromptsPerCell, []string{"facts", "rag", "twohop"}, 5, 10, 20, 50).Prompts {
		resp, err := e.Run(ctx, nil, engine.Request{Segments: p.Segments(), Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		ans, err := Decode(ctx, resp, set.Stop, set.AnswerLimit())
		if err != nil {
			t.Fatal(err)
		}
		n++
		if p.Correct(ans) {
			right++
		}
	}
	t.Logf("%d of %d held-out answers right (committed with %d, floor %d)", right, n, f.Measured, f.MinCorrect)
	if right < f.MinCorrect {
		t.Fatalf("%d of %d held-out answers right, below the floor of %d (the model was committed with %d)", right, n, f.MinCorrect, f.Measured)
	}
}
