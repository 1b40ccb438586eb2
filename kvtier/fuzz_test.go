package kvtier

import (
	"bytes"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

func FuzzFileName(f *testing.F) {
	k := chunk.Key{Fingerprint: testFP, Content: chunk.ID{Lo: 0x1234, Hi: 5}, Context: testStandalone}
	f.Add(fileName(k, 42, 4096, 1))
	f.Add("34/" + "0000000000000000")
	f.Add("")
	f.Fuzz(func(t *testing.T, rel string) {
		k, sum, size, gen, ok := parseFileName(rel)
		if ok && fileName(k, sum, size, gen) != rel {
			t.Fatalf("%q parses to %v %x %d", rel, k, sum, size)
		}
	})
}

// FuzzDiskRead stores arbitrary bytes as the file of a known entry: the
// startup check and the read must never panic, and a read that succeeds
// must return exactly the entry that was put.
func FuzzDiskRead(f *testing.F) {
	blob := makeBlob(f, testFP, 3, 8, testStandalone, 2)
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	f.Add(blob[:len(blob)-1])
	f.Add(blob[:100])
	f.Add([]byte{})
	flipped := bytes.Clone(blob)
	flipped[len(flipped)/2] ^= 4
	f.Add(flipped)
	lim := chunk.Limits{MaxBlobBytes: 1 << 20, MaxRawBytes: 1 << 20, MaxTokens: 1024, MaxLayers: 64, MaxKVHeads: 64, MaxHeadDim: 256}
	d := &diskDir{codec: chunk.CodecLossless, limits: lim}
	rel := fileName(hd.Key, hd.Checksum, len(blob), 1)
	f.Fuzz(func(t *testing.T, data []byte) {
		df, cerr := d.checkBytes(rel, data)
		if cerr == nil && (df.key != hd.Key || df.size != len(blob)) {
			t.Fatalf("check accepted %+v", df)
		}
		if len(data) == 0 || len(data) > len(blob) {
			return // read rejects these sizes before restore
		}
		dst := make([]byte, len(blob))
		stored := data
		if len(data) == len(blob) {
			copy(dst, data)
			stored = dst
		}
		if err := d.restore(rel, stored, hd.Checksum, dst); err == nil && !bytes.Equal(dst, blob) {
			t.Fatal("restore produced bytes that were never put")
		}
	})
}

// FuzzPut feeds arbitrary blobs to Put: it must never panic, and what it
// accepts must read back bit for bit and leave the budget intact.
func FuzzPut(f *testing.F) {
	blob := makeBlob(f, testFP, 3, 8, testStandalone, 2)
	f.Add(blob)
	f.Add(blob[:len(blob)-1])
	f.Add(variant(f, blob))
	bad := bytes.Clone(blob)
	bad[len(bad)-1] ^= 1
	f.Add(bad)
	lim := chunk.Limits{MaxBlobBytes: 1 << 16, MaxRawBytes: 1 << 16, MaxTokens: 256, MaxLayers: 16, MaxKVHeads: 16, MaxHeadDim: 64}
	s := openTest(f, Config{DRAMBytes: 16 * 4096, Limits: lim})
	f.Fuzz(func(t *testing.T, data []byte) {
		hd, err := s.Put(t.Context(), data, PutOptions{})
		if err != nil {
			return
		}
		h, err := s.Get(t.Context(), hd.Key)
		if err != nil {
			return // evicted by a later put of the same run
		}
		defer h.Release()
		if !bytes.Equal(h.Bytes(), data) {
			if _, verr := chunk.Verify(h.Bytes(), lim); verr != nil || len(h.Bytes()) != len(data) {
				t.Fatal("stored bytes differ from an accepted put")
			}
			// Same key and checksum put earlier: an idempotent no-op.
		}
		if st := s.Stats(); st.Tiers[TierDRAM].Bytes > st.Tiers[TierDRAM].Budget {
			t.Fatal("budget exceeded")
		}
	})
}
