package enginebench

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// newTestEngine is a small random-weight llama (4 layers, hidden 64).
func newTestEngine(t testing.TB, seed uint64) *engine.Engine {
	t.Helper()
	cfg := engine.ModelConfig{
		ModelType: "llama", HiddenSize: 64, IntermediateSize: 128, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 16, VocabSize: 256, RMSNormEps: 1e-5,
		RopeTheta: 10000, RopeStyle: chunk.RopeNeoX, MaxPositionEmbeddings: 4096, DType: chunk.F32,
	}
	dir := t.TempDir()
	if _, err := engine.WriteRandomModel(dir, cfg, seed, 1); err != nil {
		t.Fatal(err)
	}
	w, err := engine.LoadWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(w, engine.Config{Workers: 2, CacheTokens: 2048})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func TestRunBenchSmall(t *testing.T) {
	e := newTestEngine(t, 61)
	res, err := Run(t.Context(), e, engine.NewMemStore(0), Config{
		Ks: []int{2, 6}, FactTokens: 8, QueryTokens: 4, Trials: 1, Window: 6, FidelityPrompts: 3, FidelityK: 3, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.TTFT) != 2 || len(res.Fidelity) != 4 {
		t.Fatalf("%d TTFT rows, %d fidelity rows", len(res.TTFT), len(res.Fidelity))
	}
	L := e.Config().NumLayers
	for _, row := range res.TTFT {
		if row.PrefillTL != row.PromptTokens*L || row.InjectTL != 4*L {
			t.Fatalf("k=%d: token-layers prefill %d, inject %d", row.K, row.PrefillTL, row.InjectTL)
		}
		if row.RepairTL <= row.InjectTL || row.RepairTL >= row.PrefillTL {
			t.Fatalf("k=%d: repair computed %d token-layers, outside (%d, %d)", row.K, row.RepairTL, row.InjectTL, row.PrefillTL)
		}
	}
	for _, f := range res.Fidelity {
		if f.N != 3 || f.WorkFraction <= 0 || f.WorkFraction >= 1 {
			t.Fatalf("fidelity row %+v", f)
		}
	}
	md := res.Markdown()
	if len(res.Codecs) != 5 {
		t.Fatalf("%d codec rows", len(res.Codecs))
	}
	for _, c := range res.Codecs {
		lossy := c.Codec.Lossy()
		if c.N == 0 || (!lossy && c.MaxLogit > 1e-4) || (lossy && c.MaxLogit == 0) || c.Ratio <= 0 {
			t.Fatalf("codec row %v: %+v", c.Codec, c)
		}
	}
	for _, want := range []string{"| k |", "| 6 | 52 |", "standalone", "window w=6", "| int4 |"} {
		if !strings.Contains(md, want) {
			t.Fatalf("markdown lacks %q:\n%s", want, md)
		}
	}
}
