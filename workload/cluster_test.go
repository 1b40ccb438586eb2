package workload

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// All three workloads through a real 3-node cluster, tiny sizes; then the
// report and its plots.
func TestWorkloadsThroughCluster(t *testing.T) {
	testutil.SkipIfShort(t, "the workloads through a 3-node cluster")
	// A failure bound: about 20 s on 2 busy cores under -race.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	l, err := StartLocal(ctx, LocalConfig{Nodes: 3, DRAMBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := tinyEngine(t)
	fp, err := l.Client.RegisterModel(ctx, e.Spec())
	if err != nil {
		t.Fatal(err)
	}
	if fp != e.Fingerprint() {
		t.Fatalf("cluster fingerprint %v, engine %v", fp, e.Fingerprint())
	}
	store := NewClusterStore(l.Client, StoreConfig{Fingerprint: fp})

	t.Run("adapter", func(t *testing.T) {
		toks := [][]uint32{{1, 2, 3}, {4, 5, 6, 7}, {8, 9}}
		ents, err := e.EncodePrompt(ctx, []engine.Segment{{Tokens: toks[0], Chunk: true}, {Tokens: toks[1], Chunk: true}, {Tokens: toks[2], Chunk: true}})
		if err != nil {
			t.Fatal(err)
		}
		// Chunk 0 EXACT, chunk 1 only standalone, chunk 2 nowhere.
		alone, err := e.EncodeStandalone(ctx, toks[1])
		if err != nil {
			t.Fatal(err)
		}
		for _, ent := range []*chunk.Entry{ents[0], alone} {
			if err := store.Put(ctx, ent); err != nil {
				t.Fatal(err)
			}
		}
		reqs := make([]engine.LookupRequest, 3)
		for i, ent := range ents {
			reqs[i] = engine.LookupRequest{Key: ent.Key, Tokens: toks[i]}
		}
		got, err := store.Lookup(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] == nil || got[0].Key != ents[0].Key || string(got[0].KV) != string(ents[0].KV) {
			t.Fatal("chunk 0: not the exact entry's bytes")
		}
		if got[1] == nil || got[1].Key != alone.Key || got[2] != nil {
			t.Fatalf("chunk 1 %v, chunk 2 %v", got[1], got[2])
		}
		// Wrong tokens for a content: a miss, not someone else's KV.
		bad := reqs[0]
		bad.Tokens = []uint32{1, 2, 4}
		if got, err := store.Lookup(ctx, []engine.LookupRequest{bad}); err != nil || got[0] != nil {
			t.Fatalf("mismatched tokens: %v, %v", got[0], err)
		}
		pre, err := PrefixOnly(store).Lookup(ctx, []engine.LookupRequest{reqs[1], reqs[0]})
		if err != nil {
			t.Fatal(err)
		}
		if pre[0] != nil || pre[1] != nil {
			t.Fatal("prefix rule used chunks after a non-exact first chunk")
		}
	})

	cc := smallCorpus()
	rag, err := RunRAG(ctx, e, store, RAGConfig{Corpus: cc, Ks: []int{2, 4}, Requests: 2, Warm: 1, QuestionLen: 4, Sweep: []float64{0, 1}, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range rag.Points {
		f, p, c := &pt.Ways[Full], &pt.Ways[Prefix], &pt.Ways[Chunk]
		if f.N() != 2 || p.N() != 2 || c.N() != 2 {
			t.Fatalf("k=%d: %d/%d/%d requests", pt.K, f.N(), p.N(), c.N())
		}
		if f.Fid.Top1Rate() != 1 || f.Injected != 0 {
			t.Fatalf("k=%d: full prefill %+v", pt.K, f)
		}
		// Every passage was ingested: kvmesh never misses, and finds at
		// least what prefix caching finds.
		if c.Miss != 0 || c.Injected < p.Injected || p.Approx != 0 || c.Exact < 2 || p.Exact < 2 {
			t.Fatalf("k=%d: prefix %s, kvmesh %s", pt.K, kinds(p), kinds(c))
		}
		if c.TokenLayers >= f.TokenLayers || p.TokenLayers > f.TokenLayers {
			t.Fatalf("k=%d: token-layers full %d, prefix %d, kvmesh %d", pt.K, f.TokenLayers, p.TokenLayers, c.TokenLayers)
		}
	}
	last := rag.Points[len(rag.Points)-1]
	if s := last.Sweep; len(s) != 2 || s[1].Fid.MeanKL() > 1e-8 || s[1].Fid.Top1Rate() != 1 {
		t.Fatalf("sweep r=1 through the cluster: %+v", s[1].Fid)
	}

	chat, err := RunChat(ctx, e, store, rag.Corpus, ChatRunConfig{Chat: ChatConfig{Turns: 3, UserMin: 4, UserMax: 8, ReplyMin: 4, ReplyMax: 8}, Conversations: 2, Seed: 6})
	if err != nil {
		t.Fatal(err)
	}
	for tt, st := range chat.Turns {
		c := &st[Chunk]
		if c.N() != 2 {
			t.Fatalf("turn %d: %d conversations", tt, c.N())
		}
		// The history was written back after every turn: all of it hits.
		if c.Miss != 0 || c.HitRate() <= 0 || (tt > 0 && c.HitRate() <= chat.Turns[0][Chunk].HitRate()) {
			t.Fatalf("turn %d: kvmesh %s, hit rate %.2f", tt, kinds(c), c.HitRate())
		}
		if p := &st[Prefix]; p.Approx != 0 || p.Injected > c.Injected {
			t.Fatalf("turn %d: prefix %s injected %d, kvmesh %d", tt, kinds(p), p.Injected, c.Injected)
		}
	}

	mem, err := RunMemory(ctx, e, store, MemoryConfig{Ks: []int{2, 5}, Windows: []int{0, 6}, SystemLen: 5, FactTokens: 6, QueryTokens: 4, Prompts: 1, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(mem.Points) != 4 {
		t.Fatalf("%d memory points", len(mem.Points))
	}
	for _, pt := range mem.Points {
		// The system prompt is EXACT, and so is the first fact when it
		// was encoded after the system prompt alone (always for w = 0).
		minExact := 1
		if pt.Window == 0 {
			minExact = 2
		}
		if pt.Inject.Exact < minExact || pt.Inject.Exact > 2 || pt.Inject.Exact+pt.Inject.Approx != pt.K+1 || pt.Inject.Miss != 0 || pt.Inject.Injected != 5+pt.K*6 {
			t.Fatalf("w=%d k=%d: inject %s, %d tokens", pt.Window, pt.K, kinds(&pt.Inject), pt.Inject.Injected)
		}
	}

	rep := &Report{Env: Env{Model: e.Config(), KVDType: "f32", Codec: "raw", Nodes: 3, Replicas: l.Client.ReplicationFactor(), Seed: 5, Command: "go test"},
		RAG: rag, Chat: chat, Memory: mem}
	dir := t.TempDir()
	if err := rep.WritePlots(dir); err != nil {
		t.Fatal(err)
	}
	if len(rep.Plots) != 5 {
		t.Fatalf("plots %v", rep.Plots)
	}
	for _, p := range rep.Plots {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: %d bytes, %v", p, len(b), err)
		}
	}
	md := rep.Markdown()
	for _, want := range []string{"## RAG with reordered chunks", "| 4 | kvmesh chunk reuse |", "| KVBoost | 0.376 | 0.247 | 0.656 |",
		"## Multi-turn chat", "## Memory facts", "What the store holds", "![chat_hit_rate](chat_hit_rate.png)"} {
		if !strings.Contains(md, want) {
			t.Fatalf("markdown lacks %q:\n%s", want, md)
		}
	}
}
