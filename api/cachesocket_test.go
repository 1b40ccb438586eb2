//go:build linux

package api

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

// socketPair is a connected pair of unix stream sockets.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(ents)
}

// TestRecvCacheFile: one hello with one descriptor is a hand-over;
// anything else is refused and leaves no descriptor open.
func TestRecvCacheFile(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "cache")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	cases := []struct {
		name  string
		data  string
		fds   []int
		taken bool
	}{
		{"one descriptor", CacheSocketHello, []int{fd}, true},
		{"none", CacheSocketHello, nil, false},
		{"two", CacheSocketHello, []int{fd, fd}, false},
		{"too many for the room", CacheSocketHello, []int{fd, fd, fd, fd, fd, fd, fd, fd, fd, fd, fd}, false},
		{"another hello", "KVMFD\x00\x00\x02", []int{fd}, false},
		{"a longer message", CacheSocketHello + "x", []int{fd}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := socketPair(t)
			before := openFDs(t)
			var oob []byte
			if tc.fds != nil {
				oob = syscall.UnixRights(tc.fds...)
			}
			if _, _, err := a.WriteMsgUnix([]byte(tc.data), oob, nil); err != nil {
				t.Fatal(err)
			}
			got, err := RecvCacheFile(b)
			if tc.taken {
				if err != nil {
					t.Fatal(err)
				}
				x, _ := got.Stat()
				y, _ := f.Stat()
				if !os.SameFile(x, y) {
					t.Error("received another file")
				}
				got.Close()
			} else if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("err %v, want ErrBadMessage", err)
			}
			if after := openFDs(t); after != before {
				t.Errorf("%d descriptors open before, %d after", before, after)
			}
		})
	}
}

// TestCacheSocketAnswer: the answer carries the handle, or refuses.
func TestCacheSocketAnswer(t *testing.T) {
	a, b := socketPair(t)
	h := bytes.Repeat([]byte{3}, CacheHandleBytes)
	if err := AnswerCacheFile(a, h); err != nil {
		t.Fatal(err)
	}
	if err := AnswerCacheFile(a, nil); err != nil {
		t.Fatal(err)
	}
	if err := AnswerCacheFile(a, h[:5]); err == nil {
		t.Error("a short handle was sent")
	}
	got := make([]byte, 2+CacheHandleBytes)
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if got[0] != cacheFileTaken || !bytes.Equal(got[1:1+CacheHandleBytes], h) || got[1+CacheHandleBytes] != cacheFileRefused {
		t.Errorf("answers %x", got)
	}
}

// FuzzRecvCacheFile sends arbitrary bytes with 0 to 11 descriptors to the
// node's end of the cache socket: it takes a file exactly for the hello
// with one descriptor, and every descriptor it does not take is closed.
func FuzzRecvCacheFile(f *testing.F) {
	f.Add([]byte(CacheSocketHello), uint8(1))
	f.Add([]byte(CacheSocketHello), uint8(0))
	f.Add([]byte(CacheSocketHello), uint8(2))
	f.Add([]byte("KVMFD\x00\x00"), uint8(1))
	f.Add([]byte(CacheSocketHello+"\x00"), uint8(9))
	file, err := os.CreateTemp(f.TempDir(), "cache")
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		if len(data) == 0 || len(data) > 64 {
			return // an empty message carries no descriptor; a long one is many reads
		}
		fds := make([]int, int(n%12))
		for i := range fds {
			fds[i] = int(file.Fd())
		}
		a, b := socketPair(t)
		before := openFDs(t)
		var oob []byte
		if len(fds) > 0 {
			oob = syscall.UnixRights(fds...)
		}
		if _, _, err := a.WriteMsgUnix(data, oob, nil); err != nil {
			t.Fatal(err)
		}
		got, err := RecvCacheFile(b)
		want := string(data) == CacheSocketHello && len(fds) == 1
		if (err == nil) != want {
			t.Fatalf("%q with %d descriptors: taken %v, want %v (%v)", data, len(fds), err == nil, want, err)
		}
		if got != nil {
			got.Close()
		}
		if after := openFDs(t); after != before {
			t.Fatalf("%q with %d descriptors: %d descriptors open before, %d after", data, len(fds), before, after)
		}
	})
}
