package linkpace

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// TestPacedConn: a paced connection moves the same bytes both ways, in
// pieces of at most Burst; rate 0 leaves the connection as it is.
// (Its speed is measured by benchmarks, not asserted here.)
func TestPacedConn(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	if Conn(a, 0) != a {
		t.Fatal("rate 0 wrapped the connection")
	}
	pc := Conn(a, 1<<30)
	defer pc.Close()
	msg := bytes.Repeat([]byte("kvmesh"), 50000) // several bursts
	go func() {
		_, _ = b.Write(msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(b, got); err == nil {
			_, _ = b.Write(got) // echo what the paced side wrote
		}
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(pc, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read through the pacer: %v, equal %v", err, bytes.Equal(got, msg))
	}
	if n, err := pc.Write(msg); err != nil || n != len(msg) {
		t.Fatalf("write through the pacer: %d, %v", n, err)
	}
	if _, err := io.ReadFull(pc, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %v", err)
	}
}
