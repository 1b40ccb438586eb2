package inject

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/pinned"
)

// blobFetcher answers every key with one blob.
type blobFetcher struct{ blob []byte }

func (f *blobFetcher) Fetch(context.Context, chunk.Key) (Fetched, error) {
	return Fetched{Blob: pinned.Owned(f.blob), Match: chunk.MatchExact}, nil
}

// reseal rewrites the layer and header checksums of blob where its header
// lets it, so that mutations reach the codecs' decoders.
func reseal(b []byte) {
	if len(b) < 88 {
		return
	}
	toks, layers := int(binary.LittleEndian.Uint32(b[64:])), int(binary.LittleEndian.Uint32(b[68:]))
	if toks > 1<<12 || layers > 64 {
		return
	}
	sumAt := 88 + 24*layers + 4*toks
	if len(b) < sumAt+8 {
		return
	}
	payload := b[sumAt+8:]
	for l := 0; l < layers; l++ {
		ref := b[88+24*l:]
		off, n := binary.LittleEndian.Uint64(ref), binary.LittleEndian.Uint64(ref[8:])
		if off <= uint64(len(payload)) && n <= uint64(len(payload))-off {
			binary.LittleEndian.PutUint64(ref[16:], xxhash.Sum64(payload[off:off+n]))
		}
	}
	binary.LittleEndian.PutUint64(b[sumAt:], xxhash.Sum64(b[:sumAt]))
}

// FuzzInjectBlob feeds arbitrary entries to the Service. It must never
// panic; a hit writes exactly what cudakern writes for the decoded entry;
// a miss leaves the cache untouched when the blob fails its checksums,
// and otherwise touches nothing outside the chunk's own slots.
func FuzzInjectBlob(f *testing.F) {
	spec := chunk.ModelSpec{Family: "llama", Layers: 2, KVHeads: 2, HeadDim: 8, DType: chunk.BF16,
		RopeStyle: chunk.RopeNeoX, RopeTheta: 10000}
	fp := spec.Fingerprint()
	toks := []uint32{11, 22, 33, 44}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless, chunk.CodecInt8, chunk.CodecInt4, chunk.CodecFP8} {
		b := encode(f, synthEntry(rng, spec, toks, chunk.StandaloneContext()), c)
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Add([]byte("KVMC"), false)

	bf := &blobFetcher{}
	s, err := New(Config{Fetcher: bf, Models: fixedModels{spec}, Workers: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	lay := pagedkv.CacheLayout{Order: pagedkv.HND, NumBlocks: 2, BlockSize: 4, KVHeads: 1, HeadDim: 8, DType: chunk.F32}
	mem := layersOf(2, lay)
	id, err := s.RegisterInProcess(f.Context(), Descriptor{Fingerprint: fp, Layers: 2, HeadLo: 1, HeadHi: 2,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 64}, mem)
	if err != nil {
		f.Fatal(err)
	}
	fillPattern(mem, 0x77)
	guard := cloneLayers(mem)
	rope, _ := cudakern.NewRopeTable(spec, 64)
	inj := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer inj.Close()
	slots := []int{5, -1, 0, 6}

	f.Fuzz(func(t *testing.T, blob []byte, resealed bool) {
		blob = bytes.Clone(blob)
		if resealed {
			reseal(blob)
		}
		for l := range mem {
			copy(mem[l], guard[l])
		}
		bf.blob = blob
		resp, err := s.Inject(t.Context(), &Request{Cache: id, Chunks: []pagedkv.InjectChunk{{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: toks, Pos: 9, Slots: slots}}})
		if err != nil {
			t.Fatal(err)
		}
		want := cloneLayers(guard)
		if resp.Results[0].Match != chunk.MatchMiss {
			directInject(t, inj, rope, blob, lay, 1, 2, 9, slots, want)
			equalLayers(t, "hit", mem, want)
			return
		}
		if _, err := chunk.Verify(blob, chunk.Limits{}); err != nil {
			equalLayers(t, "miss with a bad checksum", mem, guard)
			return
		}
		// Only the chunk's slots may differ.
		for l := range mem {
			for kv := 0; kv < 2; kv++ {
				for _, sl := range slots {
					if sl >= 0 {
						o := lay.Offset(kv, sl, 0)
						copy(mem[l][o:o+lay.HeadDim*4], guard[l][o:])
					}
				}
			}
		}
		equalLayers(t, "miss outside the chunk's slots", mem, guard)
	})
}

// FuzzDescriptorMemory feeds arbitrary layer offsets and file sizes to
// the registration checks: they must never panic, whatever they accept is
// aligned, in bounds and free of overlap, and a shared-memory file is
// mapped exactly when it holds every layer (a refusal saying nothing
// more than ErrRefused).
func FuzzDescriptorMemory(f *testing.F) {
	f.Add(uint8(3), []byte{}, int64(1<<20))
	f.Add(uint8(2), binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 0), 16384), int64(16384))
	f.Add(uint8(2), binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 64), 0), int64(-1))
	f.Add(uint8(1), binary.LittleEndian.AppendUint64(nil, 1<<63-64), int64(0))
	lays := []pagedkv.CacheLayout{
		{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.BF16},
		{Order: pagedkv.HND, NumBlocks: 1, BlockSize: 3, KVHeads: 1, HeadDim: 2, DType: chunk.FP8E4M3},
	}
	f.Fuzz(func(t *testing.T, layers uint8, raw []byte, size int64) {
		n := int(layers%8) + 1
		ls := make([]pagedkv.CacheLayout, n)
		for i := range ls {
			ls[i] = lays[(i+int(layers>>3))%2]
		}
		m := Memory{Kind: MemoryShm}
		if len(raw) > 0 {
			for len(raw) >= 8 {
				m.Offsets = append(m.Offsets, int64(binary.LittleEndian.Uint64(raw)))
				raw = raw[8:]
			}
		}
		offs, end, err := shmOffsets(&m, ls)
		if err == nil {
			type span struct{ lo, hi int64 }
			var spans []span
			for l, o := range offs {
				hi := o + int64(ls[l].LayerBytes())
				if o < 0 || o%Alignment != 0 || hi > end || hi < o {
					t.Fatalf("accepted layer %d at %d..%d, end %d", l, o, hi, end)
				}
				for _, s := range spans {
					if o < s.hi && s.lo < hi {
						t.Fatalf("accepted overlapping layers at %d and %d", o, s.lo)
					}
				}
				spans = append(spans, span{o, hi})
			}
		}
		if err != nil || runtime.GOOS != "linux" {
			return
		}
		// The file: a memfd of size bytes (at most 1 MiB), or a missing one.
		size = min(size, 1<<20)
		var file *os.File
		if size >= 0 {
			fd, err := unix.MemfdCreate("kvmesh-fuzz", unix.MFD_CLOEXEC)
			if err != nil {
				t.Skip(err)
			}
			file = os.NewFile(uintptr(fd), "kvmesh-fuzz")
			defer file.Close()
			if err := file.Truncate(size); err != nil {
				t.Fatal(err)
			}
		}
		layers2, unmap, id, _, err := mapShm(file, offs, ls, end)
		switch {
		case err == nil && (file == nil || size < end):
			t.Fatalf("mapped a file of %d bytes for layers ending at %d", size, end)
		case err == nil:
			defer unmap()
			if id == (fileID{}) || len(layers2) != n {
				t.Fatalf("mapped %d layers, file %v", len(layers2), id)
			}
		case file != nil && size >= end && end <= 1<<20:
			t.Fatalf("refused a file of %d bytes for layers ending at %d: %v", size, end, err)
		case err.Error() != ErrRefused.Error():
			t.Fatalf("refusal says more than ErrRefused: %v", err)
		}
	})
}
