package respserver

import (
	"io"
	"strconv"
)

// sink is where replies go: the connection's bufio.Writer, or a
// command's segments while it runs beside others.
type sink interface {
	io.Writer
	io.ByteWriter
	io.StringWriter
}

// replies writes RESP2 or RESP3 replies (proto 2 or 3).
type replies struct {
	w     sink
	proto int
	num   [24]byte
}

// segments holds the replies of one command run beside others: small
// writes copied, large ones (values) by reference, which the command
// does not touch again.
type segments struct {
	segs  [][]byte
	small []byte
}

// largeWrite is the size from which a write is kept by reference.
const largeWrite = 4 << 10

func (s *segments) Write(b []byte) (int, error) {
	if len(b) < largeWrite {
		s.small = append(s.small, b...)
		return len(b), nil
	}
	s.cut()
	s.segs = append(s.segs, b)
	return len(b), nil
}

func (s *segments) WriteByte(c byte) error { s.small = append(s.small, c); return nil }

func (s *segments) WriteString(str string) (int, error) {
	s.small = append(s.small, str...)
	return len(str), nil
}

func (s *segments) cut() {
	if len(s.small) > 0 {
		s.segs = append(s.segs, s.small)
		s.small = nil
	}
}

// writeTo writes the segments to w in order.
func (s *segments) writeTo(w io.Writer) {
	s.cut()
	for _, b := range s.segs {
		_, _ = w.Write(b)
	}
}

func (p *replies) header(kind byte, n int) {
	b := append(p.num[:0], kind)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, '\r', '\n')
	_, _ = p.w.Write(b)
}

func (p *replies) simple(s string) {
	_ = p.w.WriteByte('+')
	_, _ = p.w.WriteString(s)
	_, _ = p.w.WriteString("\r\n")
}

// err writes an error reply; msg starts with its code ("ERR ...").
func (p *replies) err(msg string) {
	_ = p.w.WriteByte('-')
	for i := 0; i < len(msg); i++ {
		// A line break would end the reply early.
		if c := msg[i]; c == '\r' || c == '\n' {
			_ = p.w.WriteByte(' ')
		} else {
			_ = p.w.WriteByte(c)
		}
	}
	_, _ = p.w.WriteString("\r\n")
}

func (p *replies) int(n int) { p.header(':', n) }

func (p *replies) bulk(b []byte) {
	p.header('$', len(b))
	_, _ = p.w.Write(b)
	_, _ = p.w.WriteString("\r\n")
}

func (p *replies) bulkString(s string) {
	p.header('$', len(s))
	_, _ = p.w.WriteString(s)
	_, _ = p.w.WriteString("\r\n")
}

func (p *replies) null() {
	if p.proto == 3 {
		_, _ = p.w.WriteString("_\r\n")
		return
	}
	_, _ = p.w.WriteString("$-1\r\n")
}

func (p *replies) array(n int) { p.header('*', n) }

// mapLen starts a map of n pairs: a map in RESP3, a flat array in RESP2.
func (p *replies) mapLen(n int) {
	if p.proto == 3 {
		p.header('%', n)
		return
	}
	p.header('*', 2*n)
}
