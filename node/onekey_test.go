package node_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestOneComputationOneKey: the cluster holds a chunk with nothing before
// it under one key, standalone. A Put of the same computation under the
// root of a prefix chain or a window of no tokens is refused, and a lookup
// that wants either finds the standalone entry EXACT.
func TestOneComputationOneKey(t *testing.T) {
	nodes := startCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := newClient(t, nodes...)
	spec := testutil.Spec()
	fp, err := c.RegisterModel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(16, 5))
	ent := testutil.NewEntry(rng, spec, testutil.Tokens(rng, 6), chunk.StandaloneContext())
	blob := testutil.Encode(t, ent, chunk.CodecLossless)
	if _, err := c.Put(ctx, blob); err != nil {
		t.Fatal(err)
	}
	others := []chunk.Context{
		chunk.PrefixContext(chunk.PrefixRoot(fp)),
		{Kind: chunk.ContextWindow, Window: 16, ID: chunk.WindowID(fp, nil)},
	}
	for _, cx := range others {
		k := ent.Key
		k.Context = cx
		if _, err := c.Put(ctx, testutil.Relabel(testutil.Encode(t, ent, chunk.CodecLossless), k)); !errors.Is(err, chunk.ErrNonCanonical) {
			t.Errorf("put under %v: %v, want ErrNonCanonical", cx, err)
		}
	}
	items := []client.LookupItem{{Content: ent.Key.Content, Want: chunk.StandaloneContext()}}
	for _, cx := range others {
		items = append(items, client.LookupItem{Content: ent.Key.Content, Want: cx})
	}
	res, err := c.Lookup(ctx, fp, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Match != chunk.MatchExact || r.Key != ent.Key {
			t.Errorf("lookup wanting %v: %v %v, want exact %v", items[i].Want, r.Match, r.Key, ent.Key)
		}
	}
}
