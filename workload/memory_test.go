package workload

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/engine"
)

// EncodeFact keys each encoding by exactly what it was computed after, and
// the encoding after the system prompt alone is the one a prefill of the
// system prompt and the fact writes back (EXACT for a fact right after it).
func TestEncodeFact(t *testing.T) {
	ctx := context.Background()
	e := tinyEngine(t)
	fp := e.Fingerprint()
	system := []uint32{1, 2, 3, 4}
	conv := []uint32{10, 11, 12, 13, 14, 15, 16}
	fact := []uint32{20, 21, 22}
	_, end := chunk.PrefixChain(fp, [][]uint32{system})
	afterSystem := chunk.PrefixContext(end)
	tests := []struct {
		name   string
		system []uint32
		conv   []uint32
		w      int
		want   chunk.Context
	}{
		{"standalone", nil, conv, 0, chunk.StandaloneContext()},
		{"no conversation yet", nil, nil, 5, chunk.StandaloneContext()},
		{"window", nil, conv, 3, chunk.WindowContext(fp, 3, conv[4:])},
		{"system alone", system, conv, 0, afterSystem},
		{"system, first fact", system, nil, 5, afterSystem},
		{"system and window", system, conv, 3, chunk.WindowContext(fp, 7, append(append([]uint32{}, system...), conv[4:]...))},
		{"window wider than conversation", system, conv[:2], 5, chunk.WindowContext(fp, 6, append(append([]uint32{}, system...), conv[:2]...))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ent, err := EncodeFact(ctx, e, tc.system, tc.conv, tc.w, fact)
			if err != nil {
				t.Fatal(err)
			}
			if ent.Key.Context != tc.want || ent.Key.Content != chunk.ContentID(fp, fact) {
				t.Fatalf("key %v, want context %v", ent.Key, tc.want)
			}
		})
	}
	ent, err := EncodeFact(ctx, e, system, conv, 0, fact)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := e.EncodePrompt(ctx, []engine.Segment{{Tokens: system, Chunk: true}, {Tokens: fact, Chunk: true}})
	if err != nil {
		t.Fatal(err)
	}
	if ents[1].Key != ent.Key || !bytes.Equal(ents[1].KV, ent.KV) {
		t.Fatal("encoding after the system prompt differs from the prompt's write-back")
	}
}
