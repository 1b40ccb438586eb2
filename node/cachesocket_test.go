package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// handOver hands f to the node behind ic on its cache socket and returns
// the handle to register it with.
func handOver(t testing.TB, ctx context.Context, ic api.InjectorClient, f *os.File) []byte {
	t.Helper()
	sock, err := ic.CacheSocket(ctx, &api.CacheSocketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.SendCacheFile(ctx, sock.Address, f)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// memfd is a new memfd of size bytes, closed with the test.
func memfd(t testing.TB, size int64) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("kvmesh-node-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skipf("memfd: %v", err)
	}
	f := os.NewFile(uintptr(fd), "kvmesh-node-test")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestHeldByThisProcess: a file is the node's own when the process holds
// it under another descriptor or maps it, however it reached the check.
func TestHeldByThisProcess(t *testing.T) {
	f := memfd(t, 1<<16)
	if held, err := heldByThisProcess(f); err != nil || held {
		t.Fatalf("a memfd held only by the descriptor checked: held %v, %v", held, err)
	}
	dup, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if held, err := heldByThisProcess(f); err != nil || !held {
		t.Errorf("a memfd open under a second descriptor: held %v, %v", held, err)
	}
	unix.Close(dup)
	mem, err := unix.Mmap(int(f.Fd()), 0, 1<<16, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if held, err := heldByThisProcess(f); err != nil || !held {
		t.Errorf("a mapped memfd: held %v, %v", held, err)
	}
}

// TestCacheSocketHandles: a handle is good for one take, within its time,
// and the files waiting are bounded per user and in all; a refusal is the
// same single byte whatever the reason.
func TestCacheSocketHandles(t *testing.T) {
	s, err := listenCacheSocket(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	now := time.Unix(1000, 0)
	s.mu.Lock()
	s.now = func() time.Time { return now }
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	f := memfd(t, 4096)
	h, err := api.SendCacheFile(ctx, s.address(), f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.take(h)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := got.Stat()
	b, _ := f.Stat()
	if !os.SameFile(a, b) {
		t.Error("took another file than the one handed over")
	}
	got.Close()
	if _, err := s.take(h); !errors.Is(err, api.ErrCacheRefused) {
		t.Errorf("second take of a handle: %v", err)
	}
	if _, err := s.take(bytes.Repeat([]byte{1}, api.CacheHandleBytes)); !errors.Is(err, api.ErrCacheRefused) {
		t.Errorf("made-up handle: %v", err)
	}
	if _, err := s.take(nil); !errors.Is(err, api.ErrCacheRefused) {
		t.Errorf("no handle: %v", err)
	}

	// Expiry.
	h, err = api.SendCacheFile(ctx, s.address(), f)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	now = now.Add(cacheFileTTL)
	s.mu.Unlock()
	if _, err := s.take(h); !errors.Is(err, api.ErrCacheRefused) {
		t.Errorf("expired handle: %v", err)
	}

	// Per-user bound: this test is one user.
	var hs [][]byte
	for range maxPendingPerUser {
		h, err := api.SendCacheFile(ctx, s.address(), f)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if _, err := api.SendCacheFile(ctx, s.address(), f); !errors.Is(err, api.ErrCacheRefused) {
		t.Errorf("hand-over past the per-user bound: %v", err)
	}
	for _, h := range hs {
		g, err := s.take(h)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
	}
	s.mu.Lock()
	n := len(s.pending) + len(s.users)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("%d entries left after every take", n)
	}
	// Counted once each, after the answer.
	testutil.WaitFor(t, "10 hand-overs taken, 1 refused", func() bool {
		return readCounter(s.files.WithLabelValues("taken")) == 10 && readCounter(s.files.WithLabelValues("refused")) == 1
	})
}
