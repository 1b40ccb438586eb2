package chunk

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/huff0"
)

// huff0Decode4X is huff0's own decoding of a 4X block (table and
// streams) into dst, whose capacity is the decoded size: huffDecoder's
// reference.
func huff0Decode4X(hs *huff0.Scratch, dst, body []byte) ([]byte, error) {
	_, data, err := huff0.ReadTable(body, hs)
	if err != nil {
		return nil, err
	}
	return hs.Decoder().Decompress4X(dst[:0], data)
}

// huffDecode4X is huffDecoder's decoding of the same.
func huffDecode4X(d *huffDecoder, body []byte, m int) ([]byte, error) {
	data, err := d.readTable(body)
	if err != nil {
		return nil, err
	}
	out := make([]byte, m)
	if err := d.decompress4X(out, data); err != nil {
		return nil, err
	}
	return out, nil
}

// checkHuffSame fails unless both decoders reject body or both return the
// same bytes.
func checkHuffSame(t *testing.T, d *huffDecoder, body []byte, m int, what string) {
	t.Helper()
	want, errWant := huff0Decode4X(&huff0.Scratch{}, make([]byte, 0, m), body)
	got, errGot := huffDecode4X(d, body, m)
	if (errGot == nil) != (errWant == nil) {
		t.Fatalf("%s: huffDecoder error %v, huff0 %v", what, errGot, errWant)
	}
	if errWant == nil && !bytes.Equal(got, want) {
		t.Fatalf("%s: huffDecoder output differs from huff0's", what)
	}
}

// huffPlane draws m symbols: geometric with parameter p around a random
// centre (like an exponent plane), over an alphabet of up to 256.
func huffPlane(rng *rand.Rand, m int, p float64) []byte {
	b := make([]byte, m)
	centre := rng.IntN(256)
	for i := range b {
		k := 0
		for rng.Float64() > p && k < 200 {
			k++
		}
		if rng.IntN(2) == 0 {
			k = -k
		}
		b[i] = byte(centre + k)
	}
	return b
}

// TestHuffDecoderMatchesHuff0: on planes of many skews (table logs 1 to
// 11, via huff0's TableLog limit too) and sizes, huffDecoder returns what
// huff0 returns, and on corrupted blocks it fails where huff0 fails.
func TestHuffDecoderMatchesHuff0(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 1))
	d := &huffDecoder{}
	sizes := []int{huff4XMin, huff4XMin + 1, huff4XMin + 3, 10007, losslessBlock}
	if testing.Short() {
		sizes = sizes[:3]
	}
	var hs huff0.Scratch
	hs.Reuse = huff0.ReusePolicyNone
	blocks := 0
	for _, m := range sizes {
		for _, p := range []float64{0.97, 0.8, 0.5, 0.3, 0.1, 0.02} {
			for _, tl := range []uint8{0, 5, 8, 11} {
				plane := huffPlane(rng, m, p)
				hs.TableLog = tl
				enc, _, err := huff0.Compress4X(plane, &hs)
				if err != nil {
					continue // incompressible or RLE: no 4X block
				}
				body := append([]byte(nil), enc...)
				blocks++
				got, err := huffDecode4X(d, body, m)
				if err != nil {
					t.Fatalf("m %d p %v tablelog %d: %v", m, p, tl, err)
				}
				if !bytes.Equal(got, plane) {
					t.Fatalf("m %d p %v tablelog %d: decoded plane differs", m, p, tl)
				}
				// The wrong size, truncations and flipped bytes.
				checkHuffSame(t, d, body, m-1, "one byte short")
				checkHuffSame(t, d, body, m+1, "one byte long")
				checkHuffSame(t, d, body[:len(body)-1], m, "truncated")
				for range 8 {
					bad := append([]byte(nil), body...)
					bad[rng.IntN(len(bad))] ^= byte(1 + rng.IntN(255))
					checkHuffSame(t, d, bad, m, "flipped byte")
				}
			}
		}
	}
	if blocks < 50 {
		t.Fatalf("only %d 4X blocks: the test drew too few compressible planes", blocks)
	}
}

// FuzzHuffDecoder: on any block, huffDecoder and huff0 agree (both fail,
// or both return the same bytes). The first two bytes pick the size.
func FuzzHuffDecoder(f *testing.F) {
	rng := rand.New(rand.NewPCG(41, 2))
	var hs huff0.Scratch
	for _, p := range []float64{0.9, 0.5, 0.2} {
		m := huff4XMin + rng.IntN(3000)
		enc, _, err := huff0.Compress4X(huffPlane(rng, m, p), &hs)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte{byte(m), byte(m >> 8)}, enc...))
	}
	d := &huffDecoder{}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		m := huff4XMin + int(data[0]) + int(data[1]&0x1f)<<8
		checkHuffSame(t, d, data[2:], m, "fuzzed block")
	})
}

// directMulti is multi's entry for the window w, found by decoding the
// window a code at a time.
func directMulti(d *huffDecoder, w uint32) uint64 {
	var syms, n, used uint32
	for n < huffMaxSyms {
		e := d.single[(w<<used&(1<<huffWindow-1))>>(huffWindow-d.tableLog)]
		nb := uint32(e & 0xff)
		if nb > huffWindow-used {
			break
		}
		syms |= uint32(e>>8) << (8 * n)
		n++
		used += nb
	}
	return uint64(syms) | uint64(n)<<32 | uint64(used)<<40
}

// TestHuffFillMatchesDirect: every entry of multi is the codes that
// decoding its window one code at a time finds.
func TestHuffFillMatchesDirect(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 3))
	var hs huff0.Scratch
	hs.Reuse = huff0.ReusePolicyNone
	d := &huffDecoder{}
	tables := 0
	for _, p := range []float64{0.97, 0.8, 0.5, 0.3, 0.1, 0.02} {
		for _, tl := range []uint8{0, 5, 8, 9, 11} {
			hs.TableLog = tl
			enc, _, err := huff0.Compress1X(huffPlane(rng, 5000, p), &hs)
			if err != nil {
				continue
			}
			if _, err := d.readTable(enc); err != nil {
				t.Fatal(err)
			}
			tables++
			for w := range uint32(1 << huffWindow) {
				if got, want := d.multi[w], directMulti(d, w); got != want {
					t.Fatalf("p %v tablelog %d: entry %#x is %#x, want %#x", p, d.tableLog, w, got, want)
				}
			}
		}
	}
	if tables < 20 {
		t.Fatalf("only %d tables", tables)
	}
}
