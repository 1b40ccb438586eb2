//go:build linux

package inject

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pagedkv"
)

type memKind string

const (
	inProc memKind = "inproc"
	shmDir memKind = "shm"     // a named file in /dev/shm
	memfd  memKind = "memfd"   // an anonymous memfd by /proc/<pid>/fd/<n>
	ipc    memKind = "cudaipc" // CUDA IPC handles, opened by a stand-in device kernel
)

// registerMem registers layers of lay in the given memory and returns the
// engine's view of them.
func registerMem(t *testing.T, s *Service, kind memKind, d Descriptor, lay pagedkv.CacheLayout) (CacheID, [][]byte) {
	t.Helper()
	d.Layouts = []pagedkv.CacheLayout{lay}
	if kind == ipc {
		return registerIPC(t, s, d, lay)
	}
	if kind == inProc {
		layers := layersOf(d.Layers, lay)
		id, err := s.RegisterInProcess(t.Context(), d, layers)
		if err != nil {
			t.Fatal(err)
		}
		return id, layers
	}
	path := ""
	if kind == shmDir {
		path = fmt.Sprintf("/dev/shm/kvmesh-inject-test-%d-%d", os.Getpid(), rand.Uint64())
	}
	sc, err := CreateShm(path, d.Layers, d.Layouts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Error(err)
		}
	})
	d.Memory = sc.Memory
	id, err := s.Register(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	return id, sc.Layers
}

type injectCase struct {
	name           string
	src, dst       chunk.DType
	order          pagedkv.Order
	gptj           bool
	headLo, headHi int
	codec          chunk.Codec
	mem            memKind
}

// TestInjectMatchesDirect: what the pipeline writes into every kind of
// memory equals cudakern's direct injection of the decoded entries, byte
// for byte, over the whole cache (so nothing else was touched).
func TestInjectMatchesDirect(t *testing.T) {
	cases := []injectCase{
		{"f32-raw-nhd-inproc", chunk.F32, chunk.F32, pagedkv.NHD, false, 0, 0, chunk.CodecRaw, inProc},
		{"bf16-raw-nhd-shm-heads", chunk.BF16, chunk.BF16, pagedkv.NHD, false, 1, 3, chunk.CodecRaw, shmDir},
		{"f16-lossless-hnd-memfd", chunk.F16, chunk.F16, pagedkv.HND, false, 0, 0, chunk.CodecLossless, memfd},
		{"bf16-int8-to-f32-inproc-heads", chunk.BF16, chunk.F32, pagedkv.NHD, false, 2, 4, chunk.CodecInt8, inProc},
		{"f16-raw-to-fp8-hnd-inproc", chunk.F16, chunk.FP8E4M3, pagedkv.HND, false, 0, 0, chunk.CodecRaw, inProc},
		{"bf16-fp8codec-hnd-shm-heads", chunk.BF16, chunk.BF16, pagedkv.HND, false, 0, 2, chunk.CodecFP8, shmDir},
		{"f32-gptj-lossless-nhd-memfd", chunk.F32, chunk.F32, pagedkv.NHD, true, 0, 0, chunk.CodecLossless, memfd},
		{"bf16-int4-gptj-inproc", chunk.BF16, chunk.BF16, pagedkv.NHD, true, 3, 4, chunk.CodecInt4, inProc},
		{"bf16-raw-hnd-cudaipc-heads", chunk.BF16, chunk.BF16, pagedkv.HND, false, 1, 3, chunk.CodecRaw, ipc},
		{"f16-int8-to-fp8-nhd-cudaipc", chunk.F16, chunk.FP8E4M3, pagedkv.NHD, false, 0, 0, chunk.CodecInt8, ipc},
		{"bf16-int8-blocknhd-memfd-heads", chunk.BF16, chunk.BF16, pagedkv.BlockNHD, false, 1, 4, chunk.CodecInt8, memfd},
		{"f16-raw-to-fp8-blockhnd-shm", chunk.F16, chunk.FP8E4M3, pagedkv.BlockHND, false, 0, 0, chunk.CodecRaw, shmDir},
		{"bf16-lossless-gptj-blockhnd-cudaipc", chunk.BF16, chunk.BF16, pagedkv.BlockHND, true, 0, 2, chunk.CodecLossless, ipc},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			spec := testSpec(tc.src)
			if tc.gptj {
				spec.RopeStyle = chunk.RopeGPTJ
			}
			fp := spec.Fingerprint()
			f := newMemFetcher()
			s := newService(t, f, spec, withFakeGPU(tc.mem == ipc))
			hi := tc.headHi
			if hi == 0 {
				hi = spec.KVHeads
			}
			lay := pagedkv.CacheLayout{Order: tc.order, NumBlocks: 12, BlockSize: 16, KVHeads: hi - tc.headLo,
				HeadDim: spec.HeadDim, DType: tc.dst}
			if tc.dst == chunk.FP8E4M3 {
				lay.KScale, lay.VScale = 0.5, 2
			}
			d := Descriptor{Fingerprint: fp, Layers: spec.Layers, HeadLo: tc.headLo, HeadHi: tc.headHi, MaxPositions: 4096}
			id, mem := registerMem(t, s, tc.mem, d, lay)
			fillPattern(mem, 0x5a)
			want := cloneLayers(mem)

			sizes := []int{1, 5, 16, 24, 33, 7, 12}
			slots := slotPlan(rng, lay.Slots(), sizes, true)
			rope, err := cudakern.NewRopeTable(spec, 4096)
			if err != nil {
				t.Fatal(err)
			}
			inj := cudakern.NewInjector(cudakern.Config{Workers: 1})
			defer inj.Close()
			req := &Request{Cache: id}
			var wantBytes int64
			for i, n := range sizes {
				toks := randTokens(rng, n)
				cx := chunk.PrefixContext(chunk.ID{Lo: uint64(i + 1)})
				ch := pagedkv.InjectChunk{Key: chunk.Key{Context: cx}, Tokens: toks, Pos: rng.IntN(4096 - n), Slots: slots[i]}
				if i == 5 { // not stored: a miss
					req.Chunks = append(req.Chunks, ch)
					continue
				}
				if i%2 == 0 { // the engine may give the content ID alone
					ch.Key.Content, ch.Tokens = chunk.ContentID(fp, toks), nil
				}
				blob := f.put(t, synthEntry(rng, spec, toks, cx), tc.codec)
				directInject(t, inj, rope, blob, lay, tc.headLo, hi, ch.Pos, ch.Slots, want)
				for _, sl := range ch.Slots {
					if sl >= 0 {
						wantBytes += int64(spec.Layers * 2 * lay.KVHeads * lay.HeadDim * lay.DType.Size())
					}
				}
				req.Chunks = append(req.Chunks, ch)
			}
			resp, err := s.Inject(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range resp.Results {
				wantM := chunk.MatchExact
				if i == 5 {
					wantM = chunk.MatchMiss
				}
				if r.Match != wantM {
					t.Errorf("chunk %d: %v (%v), want %v", i, r.Match, r.Reason, wantM)
				}
				if wantM == chunk.MatchExact && r.Context != req.Chunks[i].Key.Context {
					t.Errorf("chunk %d: context %v, want %v", i, r.Context, req.Chunks[i].Key.Context)
				}
			}
			equalLayers(t, "cache", mem, want)
			if resp.WrittenBytes != wantBytes {
				t.Errorf("written %d bytes, want %d", resp.WrittenBytes, wantBytes)
			}
			if f.out.Load() != 0 {
				t.Errorf("%d blobs not released", f.out.Load())
			}
		})
	}
}

// TestMatchAndVerification: EXACT, APPROXIMATE and MISS answers, and every
// verification failure is a MISS that leaves the cache untouched.
func TestMatchAndVerification(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	spec := testSpec(chunk.BF16)
	fp := spec.Fingerprint()
	other := spec
	other.HeadDim = 32
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 8, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.BF16}
	prefix := chunk.PrefixContext(chunk.ID{Lo: 99})
	window := chunk.WindowContext(fp, 20, []uint32{1, 2, 3})

	type stored struct {
		cx     chunk.Context
		mutate func(e *chunk.Entry, blob []byte) []byte // nil: as encoded
	}
	cases := []struct {
		name    string
		stored  []stored
		want    chunk.Context
		tokens  bool // send tokens with the request
		fail    error
		match   chunk.Match
		context chunk.Context
	}{
		{name: "exact", stored: []stored{{cx: window}, {cx: prefix}}, want: prefix, match: chunk.MatchExact, context: prefix},
		{name: "approximate-window", stored: []stored{{cx: window}, {cx: chunk.StandaloneContext()}}, want: prefix,
			match: chunk.MatchApproximate, context: chunk.StandaloneContext()},
		{name: "approximate-standalone", stored: []stored{{cx: chunk.StandaloneContext()}}, want: prefix,
			match: chunk.MatchApproximate, context: chunk.StandaloneContext()},
		{name: "miss", want: prefix, match: chunk.MatchMiss},
		{name: "fetch-error", stored: []stored{{cx: prefix}}, want: prefix, fail: errors.New("replica down"), match: chunk.MatchMiss},
		{name: "corrupt-payload", stored: []stored{{cx: prefix, mutate: func(_ *chunk.Entry, b []byte) []byte {
			b[len(b)-3] ^= 0x40 // last layer: its checksum fails, after earlier layers would have been written
			return b
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "corrupt-header", stored: []stored{{cx: prefix, mutate: func(_ *chunk.Entry, b []byte) []byte {
			b[70] ^= 1
			return b
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "truncated", stored: []stored{{cx: prefix, mutate: func(_ *chunk.Entry, b []byte) []byte {
			return b[:len(b)-1]
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "wrong-tokens", tokens: true, stored: []stored{{cx: prefix, mutate: func(e *chunk.Entry, _ []byte) []byte {
			e.Tokens[3]++ // same content ID claimed, other tokens
			return nil
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "wrong-token-count", stored: []stored{{cx: prefix, mutate: func(e *chunk.Entry, _ []byte) []byte {
			e.Tokens = e.Tokens[:len(e.Tokens)-1]
			e.KV = e.KV[:e.Shape().RawBytes()]
			return nil
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "wrong-fingerprint", stored: []stored{{cx: prefix, mutate: func(e *chunk.Entry, _ []byte) []byte {
			e.Key.Fingerprint.Lo++
			return nil
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "wrong-shape", stored: []stored{{cx: prefix, mutate: func(e *chunk.Entry, _ []byte) []byte {
			e.HeadDim, e.KVHeads = 32, 2 // same bytes, other geometry
			return nil
		}}}, want: prefix, match: chunk.MatchMiss},
		{name: "wrong-dtype", stored: []stored{{cx: prefix, mutate: func(e *chunk.Entry, _ []byte) []byte {
			e.DType, e.HeadDim = chunk.F32, 8
			return nil
		}}}, want: prefix, match: chunk.MatchMiss},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newMemFetcher()
			s := newService(t, f, spec, nil)
			layers := layersOf(spec.Layers, lay)
			id, err := s.RegisterInProcess(t.Context(), Descriptor{Fingerprint: fp, Layers: spec.Layers,
				Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 1024}, layers)
			if err != nil {
				t.Fatal(err)
			}
			fillPattern(layers, 0xa5)
			guard := cloneLayers(layers)
			toks := randTokens(rng, 20)
			content := chunk.ContentID(fp, toks)
			// A good neighbour chunk is injected in the same request.
			ntoks := randTokens(rng, 9)
			nblob := f.put(t, synthEntry(rng, spec, ntoks, prefix), chunk.CodecRaw)
			slots := slotPlan(rng, lay.Slots(), []int{20, 9}, false)
			rope, _ := cudakern.NewRopeTable(spec, 1024)
			inj := cudakern.NewInjector(cudakern.Config{Workers: 1})
			defer inj.Close()
			directInject(t, inj, rope, nblob, lay, 0, 4, 300, slots[1], guard)
			for _, st := range tc.stored {
				e := synthEntry(rng, spec, toks, st.cx)
				var blob []byte
				if st.mutate != nil {
					blob = st.mutate(e, encode(t, e, chunk.CodecRaw))
					if blob == nil {
						// A mutated entry claims content's name: encode it
						// under its own, then relabel the header by hand
						// (Encode refuses a key that does not name it).
						claimed := e.Key
						claimed.Content = content
						e.Key.Content = chunk.ContentID(e.Key.Fingerprint, e.Tokens)
						blob = testutil.Relabel(encode(t, e, chunk.CodecRaw), claimed)
					}
				}
				if blob == nil {
					blob = encode(t, e, chunk.CodecRaw)
				}
				f.blobs[chunk.Key{Fingerprint: fp, Content: content, Context: st.cx}] = blob
				if tc.match != chunk.MatchMiss && st.cx == tc.context {
					directInject(t, inj, rope, blob, lay, 0, 4, 40, slots[0], guard)
				}
			}
			if tc.fail != nil {
				f.errs[content] = tc.fail
			}
			ch := pagedkv.InjectChunk{Key: chunk.Key{Content: content, Context: tc.want}, Pos: 40, Slots: slots[0]}
			if tc.tokens {
				ch.Tokens = toks
			}
			resp, err := s.Inject(t.Context(), &Request{Cache: id, Chunks: []pagedkv.InjectChunk{ch, {Key: chunk.Key{Context: prefix}, Tokens: ntoks, Pos: 300, Slots: slots[1]}}})
			if err != nil {
				t.Fatal(err)
			}
			r := resp.Results[0]
			if r.Match != tc.match || r.Context != tc.context {
				t.Errorf("got %v %v (%v), want %v %v", r.Match, r.Context, r.Reason, tc.match, tc.context)
			}
			if tc.fail != nil && !errors.Is(r.Reason, tc.fail) {
				t.Errorf("reason %v, want %v", r.Reason, tc.fail)
			}
			if resp.Results[1].Match != chunk.MatchExact {
				t.Errorf("neighbour: %v (%v)", resp.Results[1].Match, resp.Results[1].Reason)
			}
			equalLayers(t, "cache", layers, guard)
			if f.out.Load() != 0 {
				t.Errorf("%d blobs not released", f.out.Load())
			}
		})
	}
}

// TestInvalidRequest: malformed requests fail whole, before any fetch.
func TestInvalidRequest(t *testing.T) {
	spec := testSpec(chunk.F16)
	fp := spec.Fingerprint()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 2, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.F16}
	f := newMemFetcher()
	s := newService(t, f, spec, func(c *Config) { c.MaxChunks = 3 })
	layers := layersOf(spec.Layers, lay)
	id, err := s.RegisterInProcess(t.Context(), Descriptor{Fingerprint: fp, Layers: spec.Layers,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 100}, layers)
	if err != nil {
		t.Fatal(err)
	}
	toks := []uint32{1, 2, 3}
	good := pagedkv.InjectChunk{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: toks, Pos: 0, Slots: []int{0, 1, 2}}
	cases := []struct {
		name string
		mod  func(*Request)
		want error
	}{
		{"unknown-cache", func(r *Request) { r.Cache = 77 }, ErrUnknownCache},
		{"too-many", func(r *Request) { r.Chunks = append(r.Chunks, good, good, good) }, ErrInvalidRequest},
		{"slot-high", func(r *Request) { r.Chunks[0].Slots = []int{0, 1, 32} }, ErrInvalidRequest},
		{"slot-twice", func(r *Request) { r.Chunks[0].Slots = []int{4, -1, 4} }, ErrInvalidRequest},
		{"slot-twice-across", func(r *Request) {
			r.Chunks = append(r.Chunks, pagedkv.InjectChunk{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: []uint32{5}, Slots: []int{1}})
		}, ErrInvalidRequest},
		{"slot-low", func(r *Request) { r.Chunks[0].Slots = []int{0, -2, 3} }, ErrInvalidRequest},
		{"no-slots", func(r *Request) {
			r.Chunks[0].Slots = nil
			r.Chunks[0].Tokens = nil
			r.Chunks[0].Key.Content = chunk.ID{Lo: 1}
		}, ErrInvalidRequest},
		{"tokens-vs-slots", func(r *Request) { r.Chunks[0].Slots = []int{0, 1} }, ErrInvalidRequest},
		{"position", func(r *Request) { r.Chunks[0].Pos = 98 }, ErrInvalidRequest},
		{"negative-position", func(r *Request) { r.Chunks[0].Pos = -1 }, ErrInvalidRequest},
		{"fingerprint", func(r *Request) { r.Chunks[0].Key.Fingerprint = chunk.Fingerprint{Lo: 1} }, ErrInvalidRequest},
		{"content-vs-tokens", func(r *Request) { r.Chunks[0].Key.Content = chunk.ID{Lo: 1} }, ErrInvalidRequest},
		{"no-content", func(r *Request) { r.Chunks[0].Tokens = nil }, ErrInvalidRequest},
		{"context", func(r *Request) { r.Chunks[0].Key.Context = chunk.Context{} }, ErrInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := &Request{Cache: id, Chunks: []pagedkv.InjectChunk{good}}
			req.Chunks[0].Slots = append([]int(nil), good.Slots...)
			tc.mod(req)
			before := f.calls.Load()
			if _, err := s.Inject(t.Context(), req); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if f.calls.Load() != before {
				t.Error("an invalid request was fetched")
			}
		})
	}
}

// TestRegisterValidation covers every way a registration is refused.
func TestRegisterValidation(t *testing.T) {
	spec := testSpec(chunk.BF16)
	fp := spec.Fingerprint()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 4, BlockSize: 16, KVHeads: 4, HeadDim: 16, DType: chunk.BF16}
	lb := lay.LayerBytes()
	s := newService(t, newMemFetcher(), spec, func(c *Config) { c.MaxCaches = 2 })
	ctx := t.Context()

	// A shm file big enough for packed layers, and one a byte short, each
	// open read-write as an engine hands it over.
	open := func(p string, flag int) *os.File {
		f, err := os.OpenFile(p, flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	mk := func(name string, size int64) *os.File {
		p := filepath.Join("/dev/shm", fmt.Sprintf("kvmesh-inject-reg-%d-%s", os.Getpid(), name))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		return open(p, os.O_RDWR)
	}
	full := mk("full", int64(3*lb))
	short := mk("short", int64(3*lb-1))
	readOnly := open(full.Name(), os.O_RDONLY)
	dir := open("/dev/shm", os.O_RDONLY)
	// A disk file: not shared memory (unless the test directory is tmpfs:
	// then the case is skipped).
	outside := filepath.Join(t.TempDir(), "cache")
	if err := os.WriteFile(outside, make([]byte, 3*lb), 0o600); err != nil {
		t.Fatal(err)
	}
	disk := open(outside, os.O_RDWR)

	base := func() Descriptor {
		return Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 512,
			Memory: Memory{Kind: MemoryShm, File: full}}
	}
	badLay := lay
	badLay.Order = 0
	cases := []struct {
		name string
		mod  func(*Descriptor)
		want error
	}{
		{"unknown-model", func(d *Descriptor) { d.Fingerprint.Lo++ }, errNoModel},
		{"spec-mismatch", func(d *Descriptor) { d.Spec = spec; d.Spec.HeadDim = 32 }, ErrInvalidCache},
		{"layers", func(d *Descriptor) { d.Layers = 2 }, ErrInvalidCache},
		{"bad-layout", func(d *Descriptor) { d.Layouts = []pagedkv.CacheLayout{badLay} }, ErrInvalidCache},
		{"layout-count", func(d *Descriptor) { d.Layouts = []pagedkv.CacheLayout{lay, lay} }, ErrInvalidCache},
		{"head-dim", func(d *Descriptor) { d.Layouts[0].HeadDim = 8 }, ErrInvalidCache},
		{"heads-vs-range", func(d *Descriptor) { d.HeadLo, d.HeadHi = 0, 2 }, ErrInvalidCache},
		{"head-range", func(d *Descriptor) { d.HeadLo, d.HeadHi = 2, 6; d.Layouts[0].KVHeads = 4 }, ErrInvalidCache},
		{"max-positions", func(d *Descriptor) { d.MaxPositions = -1 }, ErrInvalidCache},
		{"file-too-small", func(d *Descriptor) { d.Memory.File = short }, ErrRefused},
		{"offsets-count", func(d *Descriptor) { d.Memory.Offsets = []int64{0, int64(lb)} }, ErrInvalidCache},
		{"offset-unaligned", func(d *Descriptor) { d.Memory.Offsets = []int64{0, int64(lb) + 8, int64(2*lb) + 64} }, ErrInvalidCache},
		{"offset-negative", func(d *Descriptor) { d.Memory.Offsets = []int64{-64, 0, int64(lb)} }, ErrInvalidCache},
		{"offsets-overlap", func(d *Descriptor) { d.Memory.Offsets = []int64{0, int64(lb) - 64, int64(2 * lb)} }, ErrInvalidCache},
		{"offset-past-end", func(d *Descriptor) { d.Memory.Offsets = []int64{0, int64(lb), int64(3 * lb)} }, ErrRefused},
		{"not-shared-memory", func(d *Descriptor) { d.Memory.File = disk }, ErrRefused},
		{"read-only", func(d *Descriptor) { d.Memory.File = readOnly }, ErrRefused},
		{"directory", func(d *Descriptor) { d.Memory.File = dir }, ErrRefused},
		{"no-file", func(d *Descriptor) { d.Memory.File = nil }, ErrRefused},
		// CUDA IPC: checked, then refused for want of a device kernel.
		{"cuda-ipc", func(d *Descriptor) { d.Memory = ipcMemory(3) }, ErrUnsupported},
		{"cuda-ipc-count", func(d *Descriptor) { d.Memory = ipcMemory(2) }, ErrInvalidCache},
		{"cuda-ipc-handle-size", func(d *Descriptor) { d.Memory = ipcMemory(3); d.Memory.IPCHandles[1] = make([]byte, 63) }, ErrInvalidCache},
		{"cuda-ipc-device", func(d *Descriptor) { d.Memory = ipcMemory(3); d.Memory.Device = -1 }, ErrInvalidCache},
		{"cuda-ipc-offsets", func(d *Descriptor) { d.Memory = ipcMemory(3); d.Memory.Offsets = []int64{0, 64} }, ErrInvalidCache},
		{"cuda-ipc-offset", func(d *Descriptor) { d.Memory = ipcMemory(3); d.Memory.Offsets = []int64{0, 8, 64} }, ErrInvalidCache},
		{"cuda-ipc-file", func(d *Descriptor) { d.Memory = ipcMemory(3); d.Memory.File = full }, ErrInvalidCache},
		{"in-process-kind", func(d *Descriptor) { d.Memory.Kind = MemoryInProcess }, ErrInvalidCache},
		{"no-kind", func(d *Descriptor) { d.Memory.Kind = MemoryInvalid }, ErrInvalidCache},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var fs unix.Statfs_t
			if tc.name == "not-shared-memory" && (unix.Statfs(outside, &fs) != nil || fs.Type == unix.TMPFS_MAGIC) {
				t.Skip("the test directory is on tmpfs")
			}
			d := base()
			d.Layouts = append([]pagedkv.CacheLayout(nil), d.Layouts...)
			tc.mod(&d)
			_, err := s.Register(ctx, d)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			// A refusal of the file describes nothing about it.
			if tc.want == ErrRefused && err.Error() != ErrRefused.Error() {
				t.Errorf("refusal %q says more than %q", err, ErrRefused)
			}
		})
	}
	if s.Caches() != 0 {
		t.Fatalf("%d caches after failed registrations", s.Caches())
	}

	// In-process validation.
	if _, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay}},
		layersOf(2, lay)); !errors.Is(err, ErrInvalidCache) {
		t.Errorf("2 slices for 3 layers: %v", err)
	}
	short3 := layersOf(3, lay)
	short3[1] = short3[1][:lb-1]
	if _, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay}},
		short3); !errors.Is(err, ErrInvalidCache) {
		t.Errorf("short layer: %v", err)
	}
	big := make([]byte, 2*lb)
	if _, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay}},
		[][]byte{big[:lb], big[lb/2 : lb/2+lb], big[lb:]}); !errors.Is(err, ErrInvalidCache) {
		t.Errorf("overlapping layers: %v", err)
	}
	if _, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay},
		Memory: Memory{Kind: MemoryShm}}, layersOf(3, lay)); !errors.Is(err, ErrInvalidCache) {
		t.Errorf("shm kind in process: %v", err)
	}

	// Explicit per-layer layouts and offsets work; the bound holds; an
	// unregistered ID is unknown.
	d := base()
	d.Layouts = []pagedkv.CacheLayout{lay, lay, lay}
	d.Memory.Offsets = []int64{int64(2 * lb), 0, int64(lb)}
	d.Spec = spec
	id1, err := s.Register(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	// One file is one registration: a second caller could otherwise
	// write into the first one's cache.
	if _, err := s.Register(ctx, base()); !errors.Is(err, ErrRefused) {
		t.Errorf("the same file registered twice: %v", err)
	}
	again := open(full.Name(), os.O_RDWR)
	if _, err := s.Register(ctx, Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 512,
		Memory: Memory{Kind: MemoryShm, File: again}}); !errors.Is(err, ErrRefused) {
		t.Errorf("the same file opened again and registered: %v", err)
	}
	id2, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: 3, Layouts: []pagedkv.CacheLayout{lay}}, layersOf(3, lay))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx, base()); !errors.Is(err, ErrTooManyCaches) {
		t.Errorf("third registration: %v", err)
	}
	if err := s.Unregister(id1); err != nil {
		t.Fatal(err)
	}
	if err := s.Unregister(id1); !errors.Is(err, ErrUnknownCache) {
		t.Errorf("second unregister: %v", err)
	}
	if _, err := s.Inject(ctx, &Request{Cache: id1}); !errors.Is(err, ErrUnknownCache) {
		t.Errorf("inject after unregister: %v", err)
	}
	if _, err := s.Register(ctx, base()); err != nil {
		t.Errorf("registration after unregister: %v", err)
	}
	if err := s.Unregister(id2); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx, base()); !errors.Is(err, ErrClosed) {
		t.Errorf("register after close: %v", err)
	}
}

// TestRopeTableShared: registrations of one model share a RoPE table,
// which goes away with the last of them.
func TestRopeTableShared(t *testing.T) {
	spec := testSpec(chunk.BF16)
	fp := spec.Fingerprint()
	lay := pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 1, BlockSize: 16, KVHeads: 2, HeadDim: 16, DType: chunk.BF16}
	s := newService(t, newMemFetcher(), spec, nil)
	ctx := t.Context()
	var ids []CacheID
	for _, heads := range [][2]int{{0, 2}, {2, 4}, {0, 2}} {
		id, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: spec.Layers, HeadLo: heads[0], HeadHi: heads[1],
			Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 1000}, layersOf(spec.Layers, lay))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	other, err := s.RegisterInProcess(ctx, Descriptor{Fingerprint: fp, Layers: spec.Layers, HeadLo: 0, HeadHi: 2,
		Layouts: []pagedkv.CacheLayout{lay}, MaxPositions: 2000}, layersOf(spec.Layers, lay))
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, other)
	s.mu.Lock()
	n, first := len(s.ropes), s.caches[ids[0]].rope == s.caches[ids[2]].rope
	s.mu.Unlock()
	if n != 2 || !first {
		t.Fatalf("%d tables (want 2), shared %v", n, first)
	}
	for _, id := range ids {
		if err := s.Unregister(id); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ropes) != 0 {
		t.Fatalf("%d tables left", len(s.ropes))
	}
}
