package respserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// memBackend is a Backend of maps: tokens name namespaces, and a token
// ending in ":ro" may only read.
type memBackend struct {
	tokens bool
	mu     sync.Mutex
	m      map[string][]byte // namespace + "\x00" + key
}

func (b *memBackend) Open(_ context.Context, token string) (Keyspace, error) {
	switch {
	case !b.tokens && token != "":
		return nil, ErrNoAuth
	case !b.tokens:
		return &memKeyspace{b: b}, nil
	case token == "":
		return nil, ErrAuthRequired
	case !strings.HasPrefix(token, "good"):
		return nil, ErrBadToken
	}
	ns, ro := strings.CutSuffix(token, ":ro")
	return &memKeyspace{b: b, ns: ns, ro: ro}, nil
}

type memKeyspace struct {
	b  *memBackend
	ns string
	ro bool
}

func (k *memKeyspace) Get(_ context.Context, key []byte) ([]byte, error) {
	k.b.mu.Lock()
	defer k.b.mu.Unlock()
	v, ok := k.b.m[k.ns+"\x00"+string(key)]
	if !ok {
		return nil, ErrNotFound
	}
	return bytes.Clone(v), nil
}

func (k *memKeyspace) Len(ctx context.Context, key []byte) (int, error) {
	v, err := k.Get(ctx, key)
	return len(v), err
}

func (k *memKeyspace) Set(_ context.Context, key, value []byte) error {
	if k.ro {
		return fmt.Errorf("%w: read-only token", ErrNoPerm)
	}
	k.b.mu.Lock()
	defer k.b.mu.Unlock()
	if k.b.m == nil {
		k.b.m = map[string][]byte{}
	}
	k.b.m[k.ns+"\x00"+string(key)] = bytes.Clone(value)
	return nil
}

func (k *memKeyspace) Delete(_ context.Context, key []byte) (bool, error) {
	if k.ro {
		return false, fmt.Errorf("%w: read-only token", ErrNoPerm)
	}
	k.b.mu.Lock()
	defer k.b.mu.Unlock()
	_, ok := k.b.m[k.ns+"\x00"+string(key)]
	delete(k.b.m, k.ns+"\x00"+string(key))
	return ok, nil
}

// start serves cfg (over a memBackend unless it has a Backend) on a
// loopback port until the test ends.
func start(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Backend == nil {
		cfg.Backend = &memBackend{}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(testutil.WaitTimeout))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// cmd writes args as one RESP command.
func cmd(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// exchange sends in and reads exactly len(want) bytes back.
func exchange(t *testing.T, c net.Conn, r *bufio.Reader, in, want string) {
	t.Helper()
	if _, err := io.WriteString(c, in); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("%q: read %q: %v (want %q)", in, got, err, want)
	}
	if string(got) != want {
		t.Fatalf("%q: got %q, want %q", in, got, want)
	}
}

// TestReplies: each command's exact reply bytes, as Redis writes them.
func TestReplies(t *testing.T) {
	_, addr := start(t, Config{})
	c := dial(t, addr)
	r := bufio.NewReader(c)
	for _, tc := range []struct{ in, want string }{
		{cmd("PING"), "+PONG\r\n"},
		{cmd("ping", "hi"), "$2\r\nhi\r\n"},
		{"PING\r\n", "+PONG\r\n"}, // inline
		{cmd("GET", "k"), "$-1\r\n"},
		{cmd("SET", "k", ""), "+OK\r\n"},
		{cmd("GET", "k"), "$0\r\n\r\n"},
		{cmd("SET", "k", "a\r\nb\x00"), "+OK\r\n"},
		{cmd("GET", "k"), "$5\r\na\r\nb\x00\r\n"},
		{cmd("STRLEN", "k"), ":5\r\n"},
		{cmd("STRLEN", "none"), ":0\r\n"},
		{cmd("TYPE", "k"), "+string\r\n"},
		{cmd("TYPE", "none"), "+none\r\n"},
		{cmd("EXISTS", "k", "none", "k"), ":2\r\n"},
		{cmd("SETNX", "k", "x"), ":0\r\n"},
		{cmd("SETNX", "k2", "x"), ":1\r\n"},
		{cmd("MSET", "a", "1", "b", "2"), "+OK\r\n"},
		{cmd("MGET", "a", "none", "b"), "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n2\r\n"},
		{cmd("DEL", "a", "b", "none"), ":2\r\n"},
		{cmd("SET", "k", "v", "EX", "10"), "-ERR SET option 'EX' is not supported by kvmesh (plain SET only)\r\n"},
		{cmd("SET", "k", "v", "NX"), "-ERR SET option 'NX' is not supported by kvmesh (plain SET only)\r\n"},
		{cmd("GET"), "-ERR wrong number of arguments for 'get' command\r\n"},
		{cmd("MSET", "a", "1", "b"), "-ERR wrong number of arguments for 'mset' command\r\n"},
		{cmd("HGET", "h", "f"), "-ERR unknown command 'HGET', with args beginning with: 'h' 'f' \r\n"},
		{cmd("AUTH", "pw"), "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"},
		{cmd("HELLO", "4"), "-NOPROTO unsupported protocol version\r\n"},
		{cmd("HELLO", "3"), "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"},
		{cmd("GET", "none"), "_\r\n"}, // RESP3 null
		{cmd("MGET", "none"), "*1\r\n_\r\n"},
		{cmd("HELLO", "2"), "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"},
	} {
		exchange(t, c, r, tc.in, tc.want)
	}
	exchange(t, c, r, cmd("GET", "none"), "$-1\r\n")
	exchange(t, c, r, cmd("QUIT"), "+OK\r\n")
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after QUIT: %v, want EOF", err)
	}
}
