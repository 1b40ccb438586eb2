package inject

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/pagedkv"
)

// fakeRemote is a replica set holding blobs by key.
type fakeRemote struct {
	blobs map[chunk.Key][]byte
	err   error
	gets  int
}

func (r *fakeRemote) Best(_ context.Context, fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, chunk.Match, error) {
	if r.err != nil {
		return chunk.Key{}, chunk.MatchMiss, r.err
	}
	k := chunk.Key{Fingerprint: fp, Content: content, Context: want}
	if _, ok := r.blobs[k]; ok {
		return k, chunk.MatchExact, nil
	}
	for k := range r.blobs {
		if k.Fingerprint == fp && k.Content == content {
			return k, chunk.MatchApproximate, nil
		}
	}
	return chunk.Key{}, chunk.MatchMiss, nil
}

func (r *fakeRemote) Get(_ context.Context, key chunk.Key) ([]byte, error) {
	r.gets++
	b, ok := r.blobs[key]
	if !ok {
		return nil, kvtier.ErrNotFound
	}
	return b, nil
}

// TestTierFetcher: exact anywhere (local first), then the best approximate
// as chunk.Better ranks them, local when the replicas hold none better;
// errors and misses; local blobs stay pinned until released.
func TestTierFetcher(t *testing.T) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(4, 4))
	spec := testSpec(chunk.BF16)
	fp := spec.Fingerprint()
	toks := randTokens(rng, 10)
	content := chunk.ContentID(fp, toks)
	exact := chunk.PrefixContext(chunk.ID{Lo: 5})
	window := chunk.WindowContext(fp, 8, []uint32{1})
	blob := func(cx chunk.Context) []byte { return encode(t, synthEntry(rng, spec, toks, cx), chunk.CodecRaw) }
	bExact, bWindow, bStand := blob(exact), blob(window), blob(chunk.StandaloneContext())
	key := func(cx chunk.Context) chunk.Key { return chunk.Key{Fingerprint: fp, Content: content, Context: cx} }
	cases := []struct {
		name   string
		local  [][]byte
		remote map[chunk.Key][]byte
		rerr   error
		noRem  bool
		match  chunk.Match
		want   []byte
		err    bool
		gets   int // entries read from the replicas
	}{
		{name: "local-exact", local: [][]byte{bExact, bWindow}, remote: map[chunk.Key][]byte{key(exact): bExact}, match: chunk.MatchExact, want: bExact},
		{name: "remote-exact-beats-local-approx", local: [][]byte{bWindow}, remote: map[chunk.Key][]byte{key(exact): bExact}, match: chunk.MatchExact, want: bExact, gets: 1},
		{name: "local-approx-beats-remote-approx", local: [][]byte{bWindow}, remote: map[chunk.Key][]byte{key(chunk.StandaloneContext()): bStand}, match: chunk.MatchApproximate, want: bWindow},
		{name: "better-remote-approx-beats-local-approx", local: [][]byte{bStand}, remote: map[chunk.Key][]byte{key(window): bWindow}, match: chunk.MatchApproximate, want: bWindow, gets: 1},
		{name: "same-approx-read-locally", local: [][]byte{bWindow}, remote: map[chunk.Key][]byte{key(window): bWindow}, match: chunk.MatchApproximate, want: bWindow},
		{name: "remote-approx", remote: map[chunk.Key][]byte{key(chunk.StandaloneContext()): bStand}, match: chunk.MatchApproximate, want: bStand, gets: 1},
		{name: "local-approx-remote-down", local: [][]byte{bStand}, rerr: errors.New("down"), match: chunk.MatchApproximate, want: bStand},
		{name: "remote-down", rerr: errors.New("down"), err: true},
		{name: "miss", remote: map[chunk.Key][]byte{}, match: chunk.MatchMiss},
		{name: "no-remote", local: [][]byte{bWindow}, noRem: true, match: chunk.MatchApproximate, want: bWindow},
		{name: "no-remote-miss", noRem: true, match: chunk.MatchMiss},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := kvtier.Open(kvtier.Config{DRAMBytes: 4 << 20, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			for _, b := range tc.local {
				if _, err := st.Put(ctx, b, kvtier.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f := TierFetcher{Local: st}
			fr := &fakeRemote{blobs: tc.remote, err: tc.rerr}
			if !tc.noRem {
				f.Remote = fr
			}
			got, err := f.Fetch(ctx, key(exact))
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if got.Match != tc.match || !bytes.Equal(got.Blob.Bytes(), tc.want) {
				t.Fatalf("got %v (%d bytes), want %v (%d bytes)", got.Match, got.Blob.Len(), tc.match, len(tc.want))
			}
			if fr.gets != tc.gets {
				t.Errorf("%d reads from the replicas, want %d", fr.gets, tc.gets)
			}
			got.Blob.Release()
		})
	}
}

// TestServiceOverKvtier: the Service fed by a real kvtier store through
// TierFetcher writes what cudakern writes, and releases every pin.
func TestServiceOverKvtier(t *testing.T) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(6, 6))
	spec := testSpec(chunk.F16)
	fp := spec.Fingerprint()
	st, err := kvtier.Open(kvtier.Config{DRAMBytes: 8 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := newService(t, TierFetcher{Local: st}, spec, nil)
	lay := pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 8, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: chunk.F16}
	mem := layersOf(spec.Layers, lay)
	id, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: spec.Layers, HeadLo: 2, HeadHi: 4,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 2048}, mem)
	if err != nil {
		t.Fatal(err)
	}
	want := layersOf(spec.Layers, lay)
	rope, _ := cudakern.NewRopeTable(spec, 2048)
	inj := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer inj.Close()
	sizes := []int{9, 17, 30}
	slots := slotPlan(rng, lay.Slots(), sizes, true)
	req := &Request{Cache: id}
	for i, n := range sizes {
		toks := randTokens(rng, n)
		b := encode(t, synthEntry(rng, spec, toks, chunk.StandaloneContext()), chunk.CodecLossless)
		if _, err := st.Put(ctx, b, kvtier.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		pos := 500 * i
		directInject(t, inj, rope, b, lay, 2, 4, pos, slots[i], want)
		req.Chunks = append(req.Chunks, pagedkv.InjectChunk{Key: chunk.Key{Context: chunk.PrefixContext(chunk.ID{Hi: 1})}, Tokens: toks, Pos: pos, Slots: slots[i]})
	}
	resp, err := s.Inject(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.Results {
		if r.Match != chunk.MatchApproximate || r.Context != chunk.StandaloneContext() {
			t.Errorf("chunk %d: %v %v (%v)", i, r.Match, r.Context, r.Reason)
		}
	}
	equalLayers(t, "cache", mem, want)
	if pinned := st.Stats().Tiers[kvtier.TierDRAM].PinnedBytes; pinned != 0 {
		t.Errorf("%d bytes still pinned", pinned)
	}
}
