package node

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/resp"
)

// BenchmarkRedisReference times SET and GET of the same sizes and
// concurrency as BenchmarkClusterPutGet against one redis-server (from
// Debian; skipped when it is not installed), as the reference.
func BenchmarkRedisReference(b *testing.B) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		b.Skip("redis-server not installed (apt-get install redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", b.TempDir(), "--logfile", filepath.Join(b.TempDir(), "redis.log"), "--proto-max-bulk-len", "64mb")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var conns []*resp.Conn
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := resp.Dial(addr)
		if err == nil {
			conns = append(conns, c)
			break
		}
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	const conc = 8
	for len(conns) < conc {
		c, err := resp.Dial(addr)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	b.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for _, size := range []int{1 << 20, 16 << 20} {
		count := 16
		if size > 4<<20 {
			count = 4
		}
		vals := make([][]byte, count)
		for i := range vals {
			vals[i] = bytes.Repeat([]byte{byte(i)}, size)
		}
		run := func(b *testing.B, op func(c *resp.Conn, i int, buf []byte) ([]byte, error)) {
			b.SetBytes(int64(size))
			var next atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var buf []byte
					var mine []time.Duration
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							break
						}
						t0 := time.Now()
						var err error
						if buf, err = op(conns[w], i%count, buf); err != nil {
							b.Error(err)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1e3, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1e3, "p99-ms")
			}
		}
		key := func(i int) []byte { return []byte(fmt.Sprintf("k%d-%d", size, i)) }
		set := func(c *resp.Conn, i int, buf []byte) ([]byte, error) {
			if err := c.Command([]byte("SET"), key(i), vals[i]); err != nil {
				return buf, err
			}
			_, err := c.Reply(nil)
			return buf, err
		}
		b.Run(fmt.Sprintf("set/%dMiB", size>>20), func(b *testing.B) { run(b, set) })
		b.Run(fmt.Sprintf("get/%dMiB", size>>20), func(b *testing.B) {
			for i := range count {
				if _, err := set(conns[0], i, nil); err != nil {
					b.Fatal(err)
				}
			}
			run(b, func(c *resp.Conn, i int, buf []byte) ([]byte, error) {
				if err := c.Command([]byte("GET"), key(i)); err != nil {
					return buf, err
				}
				got, err := c.Reply(buf)
				if err == nil && len(got) != size {
					err = fmt.Errorf("redis: got %d bytes", len(got))
				}
				return got, err
			})
		})
	}
}
