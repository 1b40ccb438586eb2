package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/engine"
)

// EvalPrompt is one held-out question of the trained recall model's
// evaluation set, as train/gen.py writes it: the shared system prompt, k
// chunks (memory facts, passages, or the facts of a two-hop question), the
// question, and the answer (its tokens up to and including the stop token).
type EvalPrompt struct {
	Task     string     `json:"task"` // facts, rag or twohop
	K        int        `json:"k"`
	Index    int        `json:"index"`
	System   []uint32   `json:"system"`
	Chunks   [][]uint32 `json:"chunks"`
	Question []uint32   `json:"question"`
	Answer   []uint32   `json:"answer"`
}

// EvalSet is an evaluation set: its generator seed, the token that ends an
// answer, and the prompts.
type EvalSet struct {
	Seed    int          `json:"seed"`
	Stop    uint32       `json:"stop"`
	Prompts []EvalPrompt `json:"prompts"`
}

// LoadEvalSet reads an evaluation set written by train/gen.py.
func LoadEvalSet(path string) (*EvalSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workload: read eval set: %w", err)
	}
	var s EvalSet
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("workload: eval set %s: %w", path, err)
	}
	return &s, nil
}

// Segments is the prompt as the engine serves it: the system prompt and
// each chunk as chunk segments, the question as text.
func (p *EvalPrompt) Segments() []engine.Segment {
	segs := make([]engine.Segment, 0, len(p.Chunks)+2)
	segs = append(segs, engine.Segment{Tokens: p.System, Chunk: true})
	for _, c := range p.Chunks {
		segs = append(segs, engine.Segment{Tokens: c, Chunk: true})
	}
	return append(segs, engine.Segment{Tokens: p.Question})
}

// Correct reports whether got is the expected answer.
func (p *EvalPrompt) Correct(got []uint32) bool { return slices.Equal(got, p.Answer) }

// Decode greedily continues a response run with Request.Keep: it emits
// tokens until stop (included) or max tokens, then releases the sequence.
func Decode(ctx context.Context, resp *engine.Response, stop uint32, max int) ([]uint32, error) {
	if resp.Seq == nil {
		return nil, fmt.Errorf("workload: decode needs a response run with Keep")
	}
	defer resp.Seq.Release()
	logits := resp.Logits
	var out []uint32
	for len(out) < max {
		tok := uint32(engine.Argmax(logits))
		out = append(out, tok)
		if tok == stop || len(out) == max {
			break
		}
		var err error
		if logits, err = resp.Seq.Append(ctx, []uint32{tok}); err != nil {
			return out, err
		}
	}
	return out, nil
}

// find returns the prompt of task, k and index, or nil.
func (s *EvalSet) find(task string, k, index int) *EvalPrompt {
	for i := range s.Prompts {
		if p := &s.Prompts[i]; p.Task == task && p.K == k && p.Index == index {
			return p
		}
	}
	return nil
}

// AnswerLimit bounds a decoded answer: the longest answer of the set plus
// one, so a model that does not stop is cut off right after going wrong.
func (s *EvalSet) AnswerLimit() int {
	n := 0
	for _, p := range s.Prompts {
		n = max(n, len(p.Answer))
	}
	return n + 1
}

// TorchReference is what train/reference.py measured with PyTorch on the
// trained model: next-token logits after a few prompts (for checking an
// engine against) and prefill speed.
type TorchReference struct {
	Threads int    `json:"threads"`
	Torch   string `json:"torch"`
	Logits  []struct {
		Task   string    `json:"task"`
		K      int       `json:"k"`
		Tokens []uint32  `json:"tokens"`
		Logits []float32 `json:"logits"`
	} `json:"logits"`
	// Answers are PyTorch's greedy answers to a handful of prompts.
	Answers []struct {
		Task   string   `json:"task"`
		K      int      `json:"k"`
		Index  int      `json:"index"`
		Answer []uint32 `json:"answer"`
	} `json:"answers"`
	Speed []SpeedPoint `json:"speed"`
}

// LoadTorchReference reads reference.json.
func LoadTorchReference(path string) (*TorchReference, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workload: read reference: %w", err)
	}
	var r TorchReference
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("workload: reference %s: %w", path, err)
	}
	return &r, nil
}

// LoadCurve reads a training run's curve.jsonl.
func LoadCurve(path string) ([]CurvePoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workload: read curve: %w", err)
	}
	var out []CurvePoint
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var c CurvePoint
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			return nil, fmt.Errorf("workload: curve %s: %w", path, err)
		}
		out = append(out, c)
	}
	return out, nil
}
