package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"github.com/klauspost/compress/fse"
)

// huffDecoder decodes the huff0 4X blocks of the lossless codec's planes,
// the bits huff0.Compress4X writes (the table description of
// huff0.ReadTable, then four backward bit streams). huff0's own decoder
// looks up one symbol per table read, about 0.7 ns per symbol here, which
// alone caps a 16-bit lossless decode below 3 GB/s. This one reads an
// 11-bit window per lookup and emits every whole code in it (up to four:
// the exponent plane averages under 3 bits per symbol), interleaving the
// four streams so that their lookups overlap.
//
// It accepts exactly the blocks huff0's decoder accepts, with the same
// output: every stream must decode to its quarter of the output and use
// every one of its bits (huff_test.go compares the two on random tables,
// data and corruptions).
type huffDecoder struct {
	tableLog uint8
	// single[i] is symbol<<8 | code length for the codes whose first
	// tableLog bits are i (huff0's table).
	single [1 << huffMaxLog]uint16
	// multi[w] is the codes that fit whole in the huffWindow-bit window w:
	// symbols in bytes 0-3, their count at bit 32, their total length at
	// bit 40.
	multi [1 << huffWindow]uint64
	// codes lists the codes in index order of single: longest first.
	codes   []huffCode
	weights [256]byte
	fse     fse.Scratch
}

type huffCode struct {
	sym, nb uint8
	start   uint16 // first index in single
}

const (
	huffMaxLog  = 11 // huff0's largest table log
	huffWindow  = 11
	huffMaxSyms = 4
	// huffRound is the lookups per stream between refills: a refilled
	// container holds at least 57 bits, a lookup takes at most 11.
	huffRound = 5
)

// Every window must hold a whole code, so that each lookup makes progress.
var _ [huffWindow - huffMaxLog]struct{}

// readTable reads the table description at the start of in, as
// huff0.ReadTable does, and returns the rest of in.
func (d *huffDecoder) readTable(in []byte) ([]byte, error) {
	if len(in) <= 1 {
		return nil, errors.New("input too small for table")
	}
	iSize := int(in[0])
	in = in[1:]
	var nw int
	if iSize >= 128 {
		// Weights stored as nibbles.
		nw = iSize - 127
		iSize = (nw + 1) / 2
		if iSize > len(in) {
			return nil, errors.New("input too small for table")
		}
		for n := 0; n < nw; n += 2 {
			v := in[n/2]
			d.weights[n], d.weights[n+1] = v>>4, v&15
		}
	} else {
		if len(in) < iSize {
			return nil, fmt.Errorf("input too small for table, want %d bytes, have %d", iSize, len(in))
		}
		if in[0]&15+5 > 6 {
			return nil, errors.New("corrupt input: weights tableLog too big")
		}
		d.fse.DecompressLimit = 255
		d.fse.Out = d.weights[:]
		w, err := fse.Decompress(in[:iSize], &d.fse)
		d.fse.Out = nil
		if err != nil {
			return nil, fmt.Errorf("fse decompress returned: %w", err)
		}
		if len(w) > 255 {
			return nil, errors.New("corrupt input: output table too large")
		}
		nw = copy(d.weights[:], w)
	}
	in = in[iSize:]

	var rank [16]uint32
	for _, w := range d.weights[:nw] {
		if w > huffMaxLog {
			return nil, errors.New("corrupt input: weight too large")
		}
		rank[w]++
	}
	var total uint32
	for w := 1; w < len(rank); w++ {
		total += rank[w] << (w - 1)
	}
	if total == 0 {
		return nil, errors.New("corrupt input: weights zero")
	}
	tl := bits.Len32(total)
	if tl > huffMaxLog {
		return nil, errors.New("corrupt input: tableLog too big")
	}
	// The last symbol's weight is implied: the total is a power of two.
	rest := uint32(1)<<tl - total
	last := bits.Len32(rest)
	if rest != 1<<(last-1) {
		return nil, errors.New("corrupt input: last value not power of two")
	}
	d.weights[nw] = uint8(last)
	nw++
	rank[last]++
	if rank[1] < 2 || rank[1]&1 != 0 {
		return nil, errors.New("corrupt input: min elt size, even check failed ")
	}
	var next uint32
	for w := 1; w <= tl; w++ {
		cur := next
		next += rank[w] << (w - 1)
		rank[w] = cur
	}
	d.tableLog = uint8(tl)
	for n, w := range d.weights[:nw] {
		if w == 0 {
			continue
		}
		e := uint16(n)<<8 | uint16(tl+1-int(w))
		run := d.single[rank[w] : rank[w]+1<<w>>1]
		for i := range run {
			run[i] = e
		}
		rank[w] += 1 << w >> 1
	}
	d.codes = d.codes[:0]
	for i := 0; i < 1<<tl; {
		e := d.single[i]
		nb := uint8(e)
		d.codes = append(d.codes, huffCode{sym: uint8(e >> 8), nb: nb, start: uint16(i)})
		i += 1 << (tl - int(nb))
	}
	d.fill(0, huffWindow, 0, 0, 0)
	return in, nil
}

// fill sets multi over the 1<<r windows from base, which share a prefix
// of n whole codes (symbols syms, used bits) and leave r bits.
func (d *huffDecoder) fill(base uint32, r uint8, syms uint32, n, used uint8) {
	cs := d.codes
	i := len(cs)
	for i > 0 && cs[i-1].nb <= r {
		i--
	}
	// Codes are in index order, longest first: those that fit in r bits
	// are cs[i:], at the top of the window's range; below them the next
	// code does not fit and the entry ends with the prefix.
	low := uint32(1) << r
	if i < len(cs) {
		low = d.start(cs[i], r)
	}
	e := uint64(syms) | uint64(n)<<32 | uint64(used)<<40
	fillU64(d.multi[base:base+low], e)
	for _, c := range cs[i:] {
		sub := base + d.start(c, r)
		s2, r2 := syms|uint32(c.sym)<<(8*n), r-c.nb
		if n+1 == huffMaxSyms || r2 == 0 {
			fillU64(d.multi[sub:sub+1<<r2], uint64(s2)|uint64(n+1)<<32|uint64(used+c.nb)<<40)
			continue
		}
		d.fill(sub, r2, s2, n+1, used+c.nb)
	}
}

func fillU64(s []uint64, v uint64) {
	for i := range s {
		s[i] = v
	}
}

// start is the first of the r-bit windows that begin with code c (c.nb <=
// r).
func (d *huffDecoder) start(c huffCode, r uint8) uint32 {
	return uint32(c.start) << r >> d.tableLog
}

// huffStream reads one backward bit stream as huff0's bitReaderShifted
// does: value holds the next bits at its top, bitsRead of its 64 are used
// up, and in[:off] is still to be loaded.
type huffStream struct {
	in       []byte
	off      int
	value    uint64
	bitsRead uint
}

func (s *huffStream) init(in []byte) error {
	if len(in) < 1 {
		return errors.New("corrupt stream: too short")
	}
	v := in[len(in)-1]
	if v == 0 {
		return errors.New("corrupt stream, did not find end of stream")
	}
	s.in, s.off, s.value, s.bitsRead = in, len(in), 0, 64
	if len(in) >= 8 {
		s.off -= 8
		s.value = binary.LittleEndian.Uint64(in[s.off:])
		s.bitsRead = 0
	} else {
		s.fill()
		s.fill()
	}
	s.advance(uint(9 - bits.Len8(v)))
	return nil
}

func (s *huffStream) advance(n uint) {
	s.bitsRead += n
	s.value <<= n & 63
}

// fill makes at least 32 bits available, if the stream has them.
func (s *huffStream) fill() {
	if s.bitsRead < 32 {
		return
	}
	if s.off > 4 {
		s.off -= 4
		s.value |= uint64(binary.LittleEndian.Uint32(s.in[s.off:])) << ((s.bitsRead - 32) & 63)
		s.bitsRead -= 32
		return
	}
	for s.off > 0 {
		s.off--
		s.value |= uint64(s.in[s.off]) << ((s.bitsRead - 8) & 63)
		s.bitsRead -= 8
	}
}

func (s *huffStream) remaining() int { return s.off*8 + 64 - int(s.bitsRead) }

// finish decodes the stream's symbols from out[pos] to out[end) one
// lookup each and checks that they use exactly the stream's bits.
func (s *huffStream) finish(d *huffDecoder, out []byte, pos, end int) error {
	sh := (64 - uint(d.tableLog)) & 63
	for left := s.remaining(); left > 0; {
		s.fill()
		if pos >= end {
			return errors.New("corruption detected: stream overrun 4")
		}
		e := d.single[(s.value>>sh)&(1<<huffMaxLog-1)]
		nb := uint(e & 0xff)
		s.advance(nb)
		left -= int(nb)
		out[pos] = byte(e >> 8)
		pos++
	}
	if pos != end {
		return fmt.Errorf("corruption detected: short output block, end %d != %d", pos, end)
	}
	if s.remaining() != 0 || s.bitsRead > 64 {
		return errors.New("corrupt input: stream bits left or overrun")
	}
	return nil
}

// decompress4X decodes a huff0 4X block (after its table) into out, whose
// length is the decoded size; it needs len(out) >= 16.
func (d *huffDecoder) decompress4X(out, src []byte) error {
	if len(src) < 6+4 {
		return errors.New("input too small")
	}
	var st [4]huffStream
	start := 6
	for i := range 3 {
		n := int(binary.LittleEndian.Uint16(src[2*i:]))
		if start+n >= len(src) {
			return errors.New("truncated input (or invalid offset)")
		}
		if err := st[i].init(src[start : start+n]); err != nil {
			return err
		}
		start += n
	}
	if err := st[3].init(src[start:]); err != nil {
		return err
	}
	every := (len(out) + 3) / 4
	var pos, end [4]int
	for i := range pos {
		pos[i], end[i] = min(i*every, len(out)), min((i+1)*every, len(out))
	}
	if huffAsm {
		d.fast4(&st, out, &pos, &end)
	} else {
		d.fast2(&st[0], &st[1], out, &pos[0], &pos[1], end[0], end[1])
		d.fast2(&st[2], &st[3], out, &pos[2], &pos[3], end[2], end[3])
	}
	for i := range st {
		if err := st[i].finish(d, out, pos[i], end[i]); err != nil {
			return err
		}
	}
	return nil
}

// fast2 decodes streams a and b together, huffRound multi-symbol lookups
// per stream and refill, while both have room for a round's output (4
// bytes per lookup, written whole) and 8 bytes left to load. Two streams
// at a time keep every variable in a register; their lookups overlap.
func (d *huffDecoder) fast2(a, b *huffStream, out []byte, pa, pb *int, enda, endb int) {
	const room = huffRound * huffMaxSyms
	tab := &d.multi
	in0, in1 := a.in, b.in
	v0, v1 := a.value, b.value
	r0, r1 := a.bitsRead, b.bitsRead
	o0, o1 := a.off, b.off
	p0, p1 := *pa, *pb
	e0, e1 := enda-room, endb-room
	// A refill needs bitsRead <= 63 (off goes down at most 7 bytes) and
	// leaves bitsRead <= 7.
	for r0|r1 < 64 && o0 >= 8 && o1 >= 8 && p0 <= e0 && p1 <= e1 {
		o0 -= int(r0 >> 3)
		r0 &= 7
		v0 = binary.LittleEndian.Uint64(in0[o0:]) << r0
		o1 -= int(r1 >> 3)
		r1 &= 7
		v1 = binary.LittleEndian.Uint64(in1[o1:]) << r1
		for range huffRound {
			x0 := tab[v0>>(64-huffWindow)]
			x1 := tab[v1>>(64-huffWindow)]
			binary.LittleEndian.PutUint32(out[p0:], uint32(x0))
			binary.LittleEndian.PutUint32(out[p1:], uint32(x1))
			p0 += int(x0>>32) & 7
			p1 += int(x1>>32) & 7
			n0, n1 := uint(x0>>40)&15, uint(x1>>40)&15
			v0 <<= n0
			v1 <<= n1
			r0 += n0
			r1 += n1
		}
	}
	a.value, b.value = v0, v1
	a.bitsRead, b.bitsRead = r0, r1
	a.off, b.off = o0, o1
	*pa, *pb = p0, p1
}

// huffFastState is the four streams' state as huffFast4 reads and writes
// it (simd_amd64.s has the offsets).
type huffFastState struct {
	value    [4]uint64
	bitsRead [4]uint64
	off      [4]int
	in       [4]*byte
	pos      [4]int
	end      [4]int // the last position a round may start at
}

// fast4 runs huffFast4 over the four streams when each has the 8 bytes
// a refill loads.
func (d *huffDecoder) fast4(st *[4]huffStream, out []byte, pos, end *[4]int) {
	const room = huffRound * huffMaxSyms
	var fs huffFastState
	for i := range st {
		s := &st[i]
		if s.off < 8 || s.bitsRead > 63 || pos[i] > end[i]-room {
			return
		}
		fs.value[i], fs.bitsRead[i], fs.off[i], fs.in[i] = s.value, uint64(s.bitsRead), s.off, &s.in[0]
		fs.pos[i], fs.end[i] = pos[i], end[i]-room
	}
	huffFast4(&d.multi, &out[0], &fs)
	for i := range st {
		st[i].value, st[i].bitsRead, st[i].off = fs.value[i], uint(fs.bitsRead[i]), fs.off[i]
		pos[i] = fs.pos[i]
	}
}
