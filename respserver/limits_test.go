package respserver

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestPipelining: many commands in one write get their replies in order.
func TestPipelining(t *testing.T) {
	_, addr := start(t, Config{})
	c := dial(t, addr)
	var in, want strings.Builder
	for i := range 500 {
		k := strings.Repeat("k", i%7+1) + string(rune('a'+i%26))
		in.WriteString(cmd("SET", k, k+k))
		want.WriteString("+OK\r\n")
		in.WriteString(cmd("GET", k))
		want.WriteString("$" + strconv.Itoa(2*len(k)) + "\r\n" + k + k + "\r\n")
	}
	// Then batches: SETs of distinct keys run side by side, then GETs of
	// them, a DEL of all, and GETs that find nothing.
	var all []string
	for i := range 100 {
		k := "batch" + strconv.Itoa(i)
		all = append(all, k)
		in.WriteString(cmd("SET", k, strings.Repeat(k, 1000)))
		want.WriteString("+OK\r\n")
	}
	for i := range 100 {
		v := strings.Repeat("batch"+strconv.Itoa(i), 1000)
		in.WriteString(cmd("GET", "batch"+strconv.Itoa(i)))
		want.WriteString("$" + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n")
	}
	in.WriteString(cmd(append([]string{"DEL"}, all...)...))
	want.WriteString(":100\r\n")
	for range 3 {
		in.WriteString(cmd("GET", "batch7"))
		want.WriteString("$-1\r\n")
	}
	go func() { _, _ = io.WriteString(c, in.String()) }()
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != want.String() {
		t.Fatal("pipelined replies differ from the replies one by one")
	}
}

// TestMalformed: input that is not RESP, or passes a limit, gets an error
// reply and a closed connection; the server goes on serving others.
func TestMalformed(t *testing.T) {
	cfg := Config{MaxBulkBytes: 1 << 10, MaxArgs: 8, MaxCommandBytes: 4 << 10, MaxInlineBytes: 256}
	_, addr := start(t, cfg)
	for _, tc := range []struct{ name, in, reply string }{
		{"bulk over the limit", "*2\r\n$3\r\nGET\r\n$1025\r\n", "-ERR Protocol error: bulk of 1025 bytes"},
		{"negative bulk", "*2\r\n$3\r\nGET\r\n$-5\r\n", "-ERR Protocol error: invalid bulk length"},
		{"too many arguments", "*9\r\n", "-ERR Protocol error: 9 arguments"},
		{"huge multibulk", "*99999999999999999999\r\n", "-ERR Protocol error: invalid multibulk length"},
		{"not a bulk", "*1\r\n:5\r\n", "-ERR Protocol error: expected '$'"},
		{"bulk without CRLF", "*1\r\n$4\r\nPINGxx", "-ERR Protocol error: bulk not ended by CRLF"},
		{"line without CR", "*1\n", "-ERR Protocol error: line not ended by CRLF"},
		{"long inline", strings.Repeat("x", 300), "-ERR Protocol error: line of more than 256 bytes"},
		{"command over the limit", "*6\r\n$3\r\nSET\r\n$1000\r\n" + strings.Repeat("a", 1000) + "\r\n$1000\r\n" + strings.Repeat("a", 1000) + "\r\n$1000\r\n" + strings.Repeat("a", 1000) + "\r\n$1000\r\n" + strings.Repeat("a", 1000) + "\r\n$1000\r\n", "-ERR Protocol error: command of more than"},
		{"truncated", "*2\r\n$3\r\nGET\r\n$10\r\nabc", ""},
		{"binary garbage", "*\x00\xff\r\n", "-ERR Protocol error: invalid multibulk length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			go func() {
				_, _ = io.WriteString(c, tc.in)
				if tc.reply == "" {
					_ = c.(interface{ CloseWrite() error }).CloseWrite()
				}
			}()
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(got), tc.reply) || (tc.reply == "" && len(got) > 0) {
				t.Fatalf("reply %q, want %q and the end of the connection", got, tc.reply)
			}
		})
	}
	c := dial(t, addr)
	exchange(t, c, bufio.NewReader(c), cmd("PING"), "+PONG\r\n")
}

// TestBudget: a command whose arguments would pass MaxBufferedBytes, with
// another connection's half-sent value held, is refused.
func TestBudget(t *testing.T) {
	s, addr := start(t, Config{MaxBulkBytes: 3 << 20, MaxCommandBytes: 3 << 20, MaxBufferedBytes: 3 << 20})
	slow := dial(t, addr)
	// 2 MiB announced, 1.5 MiB sent: the reader has grown to 2 MiB.
	if _, err := io.WriteString(slow, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2097152\r\n"+strings.Repeat("v", 3<<19)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the slow client's bytes held", func() bool { return s.budget.used.Load() >= 3<<19 })
	c := dial(t, addr)
	go func() {
		_, _ = io.WriteString(c, "*3\r\n$3\r\nSET\r\n$1\r\nj\r\n$2097152\r\n"+strings.Repeat("v", 2<<20)+"\r\n")
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "-BUSY ") {
		t.Fatalf("reply %q, want BUSY", got)
	}
	// The slow client finishes; its command runs, and the budget is back.
	if _, err := io.WriteString(slow, strings.Repeat("v", 1<<19)+"\r\n"); err != nil {
		t.Fatal(err)
	}
	exchange(t, slow, bufio.NewReader(slow), cmd("STRLEN", "k"), "+OK\r\n:2097152\r\n")
	testutil.WaitFor(t, "the budget given back", func() bool { return s.budget.used.Load() == 0 })
}

// TestCommandTimeout: a command that does not arrive whole in time ends
// its connection, with its memory.
func TestCommandTimeout(t *testing.T) {
	s, addr := start(t, Config{CommandTimeout: 50e6})
	c := dial(t, addr)
	if _, err := io.WriteString(c, "*2\r\n$3\r\nGET\r\n$100\r\nabc"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "-ERR command not received within") {
		t.Fatalf("reply %q", got)
	}
	testutil.WaitFor(t, "the budget given back", func() bool { return s.budget.used.Load() == 0 })
}

// TestMaxClients: a connection over MaxClients is refused.
func TestMaxClients(t *testing.T) {
	_, addr := start(t, Config{MaxClients: 1})
	c := dial(t, addr)
	exchange(t, c, bufio.NewReader(c), cmd("PING"), "+PONG\r\n")
	got, err := io.ReadAll(dial(t, addr))
	if err != nil || string(got) != "-ERR max number of clients reached\r\n" {
		t.Fatalf("second client: %q, %v", got, err)
	}
}

// TestAuth: a backend with tokens wants AUTH first; a token's namespace
// scopes its keys, and its scopes its commands.
func TestAuth(t *testing.T) {
	var mu sync.Mutex
	var refused []string
	cfg := Config{Backend: &memBackend{tokens: true}, Refused: func(c, r string) { mu.Lock(); refused = append(refused, c+":"+r); mu.Unlock() }}
	_, addr := start(t, cfg)
	c := dial(t, addr)
	r := bufio.NewReader(c)
	exchange(t, c, r, cmd("PING"), "+PONG\r\n")
	exchange(t, c, r, cmd("GET", "k"), "-NOAUTH Authentication required.\r\n")
	exchange(t, c, r, cmd("AUTH", "bad"), "-WRONGPASS invalid username-password pair or user is disabled.\r\n")
	exchange(t, c, r, cmd("AUTH", "default", "good-a"), "+OK\r\n")
	exchange(t, c, r, cmd("SET", "k", "a"), "+OK\r\n")
	exchange(t, c, r, cmd("HELLO", "3", "AUTH", "default", "good-b"), "%7\r\n")
	if _, err := r.Discard(len("$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n")); err != nil {
		t.Fatal(err)
	}
	exchange(t, c, r, cmd("GET", "k"), "_\r\n") // namespace b does not see a's key
	exchange(t, c, r, cmd("AUTH", "good-a:ro"), "+OK\r\n")
	exchange(t, c, r, cmd("GET", "k"), "$1\r\na\r\n")
	exchange(t, c, r, cmd("SET", "k", "b"), "-NOPERM respserver: permission denied: read-only token\r\n")
	want := []string{"GET:unauthenticated", "AUTH:unauthenticated", "SET:permission_denied"}
	if mu.Lock(); strings.Join(refused, " ") != strings.Join(want, " ") {
		t.Errorf("refusals %q, want %q", refused, want)
	}
	mu.Unlock()
}

// FuzzReader: any bytes read as commands end in commands within the
// limits or an error; never a panic, never more budget than the limits.
func FuzzReader(f *testing.F) {
	for _, s := range []string{cmd("SET", "k", "v"), "PING\r\n", "*2\r\n$3\r\nGET\r\n$-1\r\n", "*1\r\n$4\r\nPI", "*0\r\n*-1\r\n" + cmd("GET", "x"), "\x00\xff*\r\n$"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		lim := Config{MaxBulkBytes: 64, MaxArgs: 8, MaxCommandBytes: 256, MaxBufferedBytes: 1 << 20, MaxInlineBytes: 64}
		b := &budget{max: int64(lim.MaxBufferedBytes)}
		r := newReader(bytes.NewReader(in), &lim, b)
		for range 1000 {
			args, err := r.next()
			if err != nil {
				var pe *ProtocolError
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &pe) {
					t.Fatalf("error %v", err)
				}
				break
			}
			total := 0
			for _, a := range args {
				total += len(a)
			}
			if len(args) > lim.MaxArgs || total > lim.MaxCommandBytes+lim.MaxInlineBytes {
				t.Fatalf("%d arguments of %d bytes passed the limits", len(args), total)
			}
			r.release()
		}
		r.release()
		if b.used.Load() != 0 {
			t.Fatalf("budget %d left taken", b.used.Load())
		}
	})
}

// TestServeGarbage: random bytes on a connection end in an error reply or
// a closed connection, and the server still serves.
func TestServeGarbage(t *testing.T) {
	_, addr := start(t, Config{})
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		junk := make([]byte, 1+rng.IntN(4096))
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		c := dial(t, addr)
		go func() {
			_, _ = c.Write(junk)
			_ = c.(interface{ CloseWrite() error }).CloseWrite()
		}()
		if _, err := io.ReadAll(c); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	c := dial(t, addr)
	exchange(t, c, bufio.NewReader(c), cmd("PING"), "+PONG\r\n")
}
