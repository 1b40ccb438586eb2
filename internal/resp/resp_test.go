package resp

import (
	"bufio"
	"errors"
	"net"
	"testing"
)

// TestReplies checks the command encoding and every reply kind against a
// scripted server.
func TestReplies(t *testing.T) {
	srv, cli := net.Pipe()
	defer srv.Close()
	c := &Conn{c: cli, r: bufio.NewReader(cli), w: bufio.NewWriter(cli)}
	defer c.Close()
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 64)
		n, _ := srv.Read(buf)
		got <- string(buf[:n])
		srv.Write([]byte("+OK\r\n:2\r\n$4\r\na\r\nb\r\n$-1\r\n-ERR no\r\n"))
	}()
	if err := c.Command([]byte("SET"), []byte("k"), []byte("v\r")); err != nil {
		t.Fatal(err)
	}
	if s, want := <-got, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv\r\r\n"; s != want {
		t.Fatalf("sent %q, want %q", s, want)
	}
	for _, want := range []string{"OK", "2", "a\r\nb"} {
		if b, err := c.Reply(nil); err != nil || string(b) != want {
			t.Fatalf("reply %q, %v; want %q", b, err, want)
		}
	}
	if _, err := c.Reply(nil); !errors.Is(err, ErrNil) {
		t.Fatalf("nil bulk: %v", err)
	}
	if _, err := c.Reply(nil); err == nil || err.Error() != "ERR no" {
		t.Fatalf("error reply: %v", err)
	}
}
