package respserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
)

// ProtocolError is a request that is not RESP, or passes a limit; the
// server answers it with an error reply and closes the connection, since
// it cannot tell where the next command starts.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// errBusy: the server's buffer budget cannot take a command's arguments.
var errBusy = errors.New("respserver: the server holds too many request bytes; try again")

func protoErr(format string, a ...any) error { return &ProtocolError{Msg: fmt.Sprintf(format, a...)} }

// budget is the argument bytes all connections may hold together.
type budget struct {
	max  int64
	used atomic.Int64
}

func (b *budget) take(n int) bool {
	if b.used.Add(int64(n)) > b.max {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

func (b *budget) give(n int) { b.used.Add(-int64(n)) }

// growStep is the most a bulk argument's buffer grows by before the bytes
// that fill it have arrived: a client that announces a large value holds
// little more memory than it has sent.
const growStep = 1 << 20

// reader reads commands from one connection.
type reader struct {
	br     *bufio.Reader
	lim    *Config
	budget *budget
	held   int // budget taken for the command being read or run
}

func newReader(r io.Reader, lim *Config, b *budget) *reader {
	return &reader{br: bufio.NewReaderSize(r, lim.MaxInlineBytes), lim: lim, budget: b}
}

// release gives back the budget of the command being read.
func (r *reader) release() {
	r.budget.give(r.held)
	r.held = 0
}

// detach returns the budget the last command read holds, which its caller
// now gives back (budget.give) once the command ran.
func (r *reader) detach() int {
	n := r.held
	r.held = 0
	return n
}

func (r *reader) reserve(n int) error {
	if !r.budget.take(n) {
		return errBusy
	}
	r.held += n
	return nil
}

// line reads one line without its end ("\r\n", or "\n" when crlf is
// false); it aliases the reader's buffer until the next read.
func (r *reader) line(crlf bool) ([]byte, error) {
	b, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, protoErr("line of more than %d bytes", r.lim.MaxInlineBytes)
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(b) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	b = b[:len(b)-1]
	if n := len(b); n > 0 && b[n-1] == '\r' {
		return b[:n-1], nil
	}
	if crlf {
		return nil, protoErr("line not ended by CRLF")
	}
	return b, nil
}

// number parses a length of a multibulk or bulk header.
func number(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return int(n), err == nil
}

// next reads one command: nil args (and a nil error) for an empty one.
// The args are the caller's until the next call; release gives back their
// budget once the command ran.
func (r *reader) next() ([][]byte, error) {
	first, err := r.br.Peek(1)
	if err != nil {
		return nil, err
	}
	if first[0] != '*' {
		return r.inline()
	}
	hdr, err := r.line(true)
	if err != nil {
		return nil, err
	}
	n, ok := number(hdr[1:])
	if !ok {
		return nil, protoErr("invalid multibulk length")
	}
	if n <= 0 {
		return nil, nil
	}
	if n > r.lim.MaxArgs {
		return nil, protoErr("%d arguments, the limit is %d", n, r.lim.MaxArgs)
	}
	args := make([][]byte, 0, min(n, 64))
	total := 0
	for range n {
		h, err := r.line(true)
		if err != nil {
			return nil, err
		}
		if len(h) == 0 || h[0] != '$' {
			q := "end of line"
			if len(h) > 0 {
				q = strconv.QuoteRune(rune(h[0]))
			}
			return nil, protoErr("expected '$', got %s", q)
		}
		l, ok := number(h[1:])
		if !ok || l < 0 {
			return nil, protoErr("invalid bulk length")
		}
		if l > r.lim.MaxBulkBytes {
			return nil, protoErr("bulk of %d bytes, the limit is %d", l, r.lim.MaxBulkBytes)
		}
		if total += l; total > r.lim.MaxCommandBytes {
			return nil, protoErr("command of more than %d bytes", r.lim.MaxCommandBytes)
		}
		arg, err := r.bulk(l)
		if err != nil {
			return nil, err
		}
		args = append(args, arg)
	}
	return args, nil
}

// bulk reads l bytes and the CRLF after them, growing its buffer as they
// arrive.
func (r *reader) bulk(l int) ([]byte, error) {
	c := min(l, growStep)
	if err := r.reserve(c); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, c)
	for len(buf) < l {
		if len(buf) == cap(buf) {
			grow := min(l-len(buf), max(cap(buf), growStep))
			if err := r.reserve(grow); err != nil {
				return nil, err
			}
			buf = append(buf[:cap(buf)], make([]byte, grow)...)[:len(buf)]
		}
		m, err := io.ReadFull(r.br, buf[len(buf):min(cap(buf), l)])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, unexpected(err)
		}
	}
	var crlf [2]byte
	if _, err := io.ReadFull(r.br, crlf[:]); err != nil {
		return nil, unexpected(err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return nil, protoErr("bulk not ended by CRLF")
	}
	return buf, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// inline reads a command written as one line of words (telnet style).
func (r *reader) inline() ([][]byte, error) {
	l, err := r.line(false)
	if err != nil {
		return nil, err
	}
	words := bytes.Fields(l)
	if len(words) == 0 {
		return nil, nil
	}
	if len(words) > r.lim.MaxArgs {
		return nil, protoErr("%d arguments, the limit is %d", len(words), r.lim.MaxArgs)
	}
	if err := r.reserve(len(l)); err != nil {
		return nil, err
	}
	args := make([][]byte, len(words))
	for i, w := range words {
		args[i] = bytes.Clone(w)
	}
	return args, nil
}
