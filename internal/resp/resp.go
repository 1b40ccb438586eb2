// Package resp is a minimal RESP2 client for redis-server: commands with
// binary arguments and their replies (status, error, integer, bulk). It is
// only what the benchmarks need to time redis-server as the reference for
// Put and Get; it is not a Redis client library.
package resp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
)

// Conn is one connection. It is not safe for concurrent use.
type Conn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// Dial connects to addr.
func Dial(addr string) (*Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriterSize(c, 1<<20)}, nil
}

// Close closes the connection.
func (r *Conn) Close() error { return r.c.Close() }

// Command sends one command.
func (r *Conn) Command(args ...[]byte) error {
	fmt.Fprintf(r.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(r.w, "$%d\r\n", len(a))
		r.w.Write(a)
		r.w.WriteString("\r\n")
	}
	return r.w.Flush()
}

// ErrNil is the reply to a GET of a missing key.
var ErrNil = errors.New("redis: nil")

// Reply reads one reply. A bulk string is read into dst (grown as needed)
// and returned; a status or integer reply returns its text.
func (r *Conn) Reply(dst []byte) ([]byte, error) {
	line, err := r.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 {
		return nil, fmt.Errorf("redis: reply %q", line)
	}
	text := line[1 : len(line)-2]
	switch line[0] {
	case '+', ':':
		return append(dst[:0], text...), nil
	case '-':
		return nil, errors.New(text)
	case '$':
		n, err := strconv.Atoi(text)
		if err != nil {
			return nil, fmt.Errorf("redis: bulk %q", line)
		}
		if n < 0 {
			return nil, ErrNil
		}
		dst = slices.Grow(dst[:0], n+2)[:n+2]
		if _, err := io.ReadFull(r.r, dst); err != nil {
			return nil, err
		}
		return dst[:n], nil
	}
	return nil, fmt.Errorf("redis: reply %q", line)
}

// Do sends one command and reads its reply into dst.
func (r *Conn) Do(dst []byte, args ...string) ([]byte, error) {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	if err := r.Command(bs...); err != nil {
		return nil, err
	}
	return r.Reply(dst)
}
