//go:build linux

package kvtier

import (
	"bytes"
	"errors"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
	"golang.org/x/sys/unix"
)

// residentBytes is the memory the arena's memfd holds now (its st_blocks),
// which is what it adds to the process's RSS once mapped.
func residentBytes(t testing.TB, s *Store) int64 {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var st unix.Stat_t
	if err := unix.Fstat(s.arena.fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// settleRelease waits until no release of freed pages is due or running
// (the releaser punches in the background).
func settleRelease(s *Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.arena.reservedPages() > 0 || (!s.closed && s.arena.punchDue()) {
		s.moved.Wait()
	}
}

// releasing reports whether a release of freed pages is due or running.
func releasing(s *Store) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.arena.reservedPages() > 0 || s.arena.punchDue()
}

// fillStore puts copies of blob under fresh keys until the DRAM arena has
// no room for another, and returns their keys in the order put.
func fillStore(t testing.TB, s *Store, blob []byte) []chunk.Key {
	t.Helper()
	var keys []chunk.Key
	for i := uint64(1); s.arena.freePages() >= s.arena.pagesFor(len(blob)); i++ {
		keys = append(keys, rekey(t, blob, i))
		if _, err := s.Put(t.Context(), blob, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// heldPunch holds the releaser's first punch of freed pages (punchHook)
// until the test lets it go on.
type heldPunch struct {
	started chan struct{} // closed when the punch begins
	proceed chan struct{} // closed by letGo
	once    sync.Once
}

// holdPunch makes s's next punch wait for letGo. Callers defer letGo, so
// that a failing test does not leave the releaser, and Close, blocked.
func holdPunch(s *Store) *heldPunch {
	h := &heldPunch{started: make(chan struct{}), proceed: make(chan struct{})}
	var hold sync.Once
	s.punchHook = func() {
		hold.Do(func() {
			close(h.started)
			<-h.proceed
		})
	}
	return h
}

// letGo lets the held punch go on; it may be called more than once.
func (h *heldPunch) letGo() { h.once.Do(func() { close(h.proceed) }) }

// deleteUntilRelease deletes keys in order until one of the deletes makes
// a release of freed pages due (the releaser runs it).
func deleteUntilRelease(s *Store, keys []chunk.Key) error {
	for _, k := range keys {
		if err := s.Delete(k); err != nil {
			return err
		}
		if releasing(s) {
			break
		}
	}
	return nil
}

// TestReleaseToOS fills the DRAM tier, deletes a share of the entries in
// two steps and checks when the memfd's resident memory drops: only once
// the freed bytes reach ReleaseBytes, and then to less than the live pages
// plus ReleaseBytes.
// The surviving entries must read back intact, and new puts must work in
// the punched pages.
func TestReleaseToOS(t *testing.T) {
	const budget = 32 << 20
	cases := []struct {
		name    string
		release int64
		// after deleting the first and the second quarter of the entries
		dropAfter1, dropAfter2 bool
	}{
		{"default-eighth", 0, true, true},
		{"threshold-above-a-quarter", 12 << 20, false, true},
		{"never", -1, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := openTest(t, Config{DRAMBytes: budget, PageSize: 64 << 10, ReleaseBytes: tc.release})
			ctx := t.Context()
			blob := bigBlob(t, 8)
			var keys []uint64
			for i := uint64(1); ; i++ {
				if s.arena.freePages() < s.arena.pagesFor(len(blob)) {
					break
				}
				rekey(t, blob, i)
				if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
					t.Fatal(err)
				}
				keys = append(keys, i)
			}
			full := residentBytes(t, s)
			if want := int64(len(keys) * len(blob)); full < want {
				t.Fatalf("memfd holds %d bytes after putting %d", full, want)
			}
			q := len(keys) / 4
			step := func(del []uint64, wantDrop bool, before int64) int64 {
				t.Helper()
				for _, i := range del {
					if err := s.Delete(rekey(t, blob, i)); err != nil {
						t.Fatal(err)
					}
				}
				settleRelease(s)
				now := residentBytes(t, s)
				s.mu.RLock()
				live := int64(s.arena.nused) * int64(s.arena.pageSize)
				s.mu.RUnlock()
				// What may stay resident: live pages, and freed ones
				// short of the threshold.
				keep := int64(budget) + 1
				if r := s.cfg.ReleaseBytes; r > 0 {
					keep = live + r
				}
				switch {
				case wantDrop && (now >= before || now >= keep):
					t.Fatalf("resident %d -> %d bytes with %d live; want a drop below %d", before, now, live, keep)
				case !wantDrop && now != before:
					t.Fatalf("resident %d -> %d bytes; want no release below ReleaseBytes", before, now)
				}
				return now
			}
			mid := step(keys[:q], tc.dropAfter1, full)
			_ = step(keys[q:2*q], tc.dropAfter2, mid)
			for _, i := range keys[2*q:] {
				k := rekey(t, blob, i)
				h, err := s.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(h.Bytes(), blob) {
					t.Fatalf("entry %d changed after pages were released", i)
				}
				h.Release()
			}
			// The freed pages take new entries again.
			for _, i := range keys[:2*q] {
				rekey(t, blob, i+1<<32)
				if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for _, i := range keys[:2*q] {
				h, err := s.Get(ctx, rekey(t, blob, i+1<<32))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(h.Bytes(), blob) {
					t.Fatalf("entry %d put into released pages reads back changed", i)
				}
				h.Release()
			}
			checkBudgets(t, s)
		})
	}
}

// TestFullTierDoesNotPunch: a tier that runs full and evicts to make room
// reuses the freed pages at once, so it never returns them to the OS (which
// would make every put fault its pages in again).
func TestFullTierDoesNotPunch(t *testing.T) {
	s := openTest(t, Config{DRAMBytes: 8 << 20, PageSize: 64 << 10})
	blob := bigBlob(t, 4)
	for i := uint64(1); i <= 64; i++ {
		rekey(t, blob, i)
		if _, err := s.Put(t.Context(), blob, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.arena.punched != 0 {
		t.Fatalf("%d hole punches in a tier that never shrank", s.arena.punched)
	}
	if s.tiers[TierDRAM].stats.Evictions == 0 {
		t.Fatal("no evictions: the test did not fill the tier")
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPutFresh puts 256 MiB of 4 MiB entries into a freshly opened
// store per iteration, so every page is written for the first time, and
// reports CPU seconds per GiB put (the whole process's, so run it alone).
// populate=false is the plain first-touch path (a page fault per 4 KiB);
// prefault=true commits the whole arena at Open (counted too); resident
// puts into pages written once before and freed (the floor: the copy).
func BenchmarkPutFresh(b *testing.B) {
	const total = 256 << 20
	for _, mode := range []string{"populate=false", "populate=true", "prefault=true", "resident"} {
		b.Run(mode, func(b *testing.B) {
			blob := bigBlob(b, 32)
			b.SetBytes(total)
			var cpu time.Duration
			for range b.N {
				b.StopTimer()
				c0 := cpuTime(b)
				b.StartTimer()
				s, err := Open(Config{DRAMBytes: total + 64<<20, PageSize: 64 << 10, SkipVerify: true,
					Prefault: mode == "prefault=true", ReleaseBytes: -1})
				if err != nil {
					b.Fatal(err)
				}
				if mode == "populate=false" {
					s.arena.populate.Store(false)
				}
				if mode == "resident" {
					b.StopTimer()
					putTotal(b, s, blob, total, 1<<32)
					for i := uint64(1); i <= total/uint64(len(blob)); i++ {
						if err := s.Delete(rekey(b, blob, i+1<<32)); err != nil {
							b.Fatal(err)
						}
					}
					c0 = cpuTime(b)
					b.StartTimer()
				}
				putTotal(b, s, blob, total, 0)
				cpu += cpuTime(b) - c0
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(cpu.Seconds()/float64(b.N)/(float64(total)/(1<<30)), "cpu-s/GiB")
		})
	}
}

// putTotal puts total bytes of copies of blob, keyed from base+1.
func putTotal(b *testing.B, s *Store, blob []byte, total int, base uint64) {
	for i := uint64(1); i <= uint64(total/len(blob)); i++ {
		rekey(b, blob, base+i)
		if _, err := s.Put(b.Context(), blob, PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestArenaResidency follows which allocations prepare faults in: pages
// never written, and pages punched since, but not pages freed and reused
// or committed at Open.
func TestArenaResidency(t *testing.T) {
	const page = 64 << 10
	cases := []struct {
		name                           string
		prefault                       bool
		release                        int64
		first, reused, afterTheRelease bool // want fresh
	}{
		{"lazy", false, 4 * page, true, false, true},
		{"prefault", true, 4 * page, false, false, true},
		{"never-release", false, -1, true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := newArena(16*page, page, tc.prefault, tc.release)
			if err != nil {
				t.Fatal(err)
			}
			defer a.close()
			alloc := func(n int, want bool, what string) pageSpan {
				t.Helper()
				sp, err := a.alloc(n, n*page)
				if err != nil {
					t.Fatal(err)
				}
				if sp.fresh != want {
					t.Fatalf("%s: fresh = %v, want %v", what, sp.fresh, want)
				}
				a.prepare(&sp)
				sp.view[0], sp.view[len(sp.view)-1] = 1, 1
				return sp
			}
			sp := alloc(2, tc.first, "first allocation")
			a.release(&sp) // 2 pages free: under the threshold
			sp = alloc(2, tc.reused, "reused pages")
			a.release(&sp)
			big := alloc(8, tc.first, "pages never used")
			a.release(&big) // 8 free resident pages: over the threshold
			if due := a.punchDue(); due != (tc.release > 0) {
				t.Fatalf("punch due = %v with 8 free resident pages, release at %d bytes", due, tc.release)
			}
			if a.punchDue() {
				// What the Store does in unlock, here without the lock.
				free := a.freePages()
				runs := a.reserveFree()
				if a.nfreeRes != 0 || a.reservedPages() != 8 || a.freePages() != free-8 || a.freeResidentPages() != 8 {
					t.Fatalf("reserved %d pages, %d free, %d free resident (%d before); want 8 reserved, none left free-resident",
						a.reservedPages(), a.freePages(), a.nfreeRes, free)
				}
				if got := a.punchRuns(runs); got != 8 {
					t.Fatalf("punched %d pages, want 8", got)
				}
				a.unreserve(runs)
				if a.reservedPages() != 0 || a.freePages() != free || a.freeResidentPages() != 0 {
					t.Fatalf("after the punch: %d reserved, %d free (want %d), %d free resident",
						a.reservedPages(), a.freePages(), free, a.freeResidentPages())
				}
			}
			_ = alloc(2, tc.afterTheRelease, "pages released to the OS")
		})
	}
}

// TestReadsDuringRelease holds a release of freed pages to the OS in the
// middle (punchHook) and checks that the store works meanwhile: a Get of
// a live entry is served (on the shared fast path and on the exclusive
// one), the pages being punched are neither free nor charged, and a put
// that needs them waits for the punch (allocWaitHook) instead of evicting.
// Were the punch run under the store's lock, the Get in the hook's window
// would deadlock the test.
func TestReadsDuringRelease(t *testing.T) {
	for _, pol := range []Policy{PolicyS3FIFO, PolicyLRU} {
		t.Run(pol.String(), func(t *testing.T) {
			const release = 4 << 20
			s := openTest(t, Config{DRAMBytes: 16 << 20, PageSize: 64 << 10, ReleaseBytes: release, Policy: pol})
			ctx := t.Context()
			keys := fillStore(t, s, bigBlob(t, 8))
			live := keys[len(keys)-1]
			want, err := s.Get(ctx, live)
			if err != nil {
				t.Fatal(err)
			}
			wantBytes := bytes.Clone(want.Bytes())
			want.Release()

			held := holdPunch(s)
			defer held.letGo()
			deleted := make(chan error, 1)
			go func() {
				// Delete until one of the deletes makes a release due,
				// then wait for it to start. It reports nil only after
				// the test lets the punch go on.
				if err := deleteUntilRelease(s, keys[:len(keys)-1]); err != nil {
					deleted <- err
					return
				}
				select {
				case <-held.started:
				case <-time.After(20 * time.Second):
					deleted <- errors.New("no release started")
					return
				}
				<-held.proceed
				deleted <- nil
			}()
			select {
			case <-held.started:
			case err := <-deleted:
				t.Fatalf("deletes ended (err %v) without a release", err)
			}

			// The release is in flight, without the lock.
			for range 2 {
				h, err := s.Get(ctx, live)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(h.Bytes(), wantBytes) {
					t.Fatal("live entry changed during a release")
				}
				h.Release()
			}
			st := checkBudgets(t, s)
			d := st.Tiers[TierDRAM]
			s.mu.RLock()
			reserved := int64(s.arena.reservedPages()) * int64(s.arena.pageSize)
			free := int64(s.arena.freePages()) * int64(s.arena.pageSize)
			s.mu.RUnlock()
			if reserved < release || d.FreeResidentBytes < reserved || d.ReleasedBytes != 0 {
				t.Fatalf("during the release: %d bytes reserved, %d free-resident, %d released; want >= %d reserved, none released yet",
					reserved, d.FreeResidentBytes, d.ReleasedBytes, release)
			}
			if d.Bytes+reserved+free != d.Budget {
				t.Fatalf("charged %d + reserved %d + free %d != budget %d", d.Bytes, reserved, free, d.Budget)
			}

			// A put that needs the reserved pages waits for them.
			waiting := make(chan struct{})
			var waitOnce sync.Once
			s.mu.Lock()
			s.allocWaitHook = func() { waitOnce.Do(func() { close(waiting) }) }
			s.mu.Unlock()
			put, extra := make(chan error, 1), bigBlob(t, 9)
			go func() {
				_, err := s.Put(ctx, extra, PutOptions{})
				put <- err
			}()
			<-waiting
			held.letGo()
			if err := <-put; err != nil {
				t.Fatal(err)
			}
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}
			settleRelease(s)

			d = checkBudgets(t, s).Tiers[TierDRAM]
			if d.Evictions != 0 {
				t.Fatalf("%d evictions; a put should wait for pages being released", d.Evictions)
			}
			if d.ReleasedBytes < release || d.FreeResidentBytes >= release {
				t.Fatalf("after the release: %d bytes released, %d free-resident; want >= %d and < %d",
					d.ReleasedBytes, d.FreeResidentBytes, release, release)
			}
			s.mu.RLock()
			r := s.arena.reservedPages()
			s.mu.RUnlock()
			if r != 0 {
				t.Fatalf("%d pages still reserved after the release", r)
			}
		})
	}
}

// BenchmarkGetDuringRelease times Gets of a live entry while another
// goroutine deletes and re-puts 64 MiB of entries in a loop, so that the
// freed pages cross ReleaseBytes (32 MiB) and go back to the OS over and
// over. The tail (p99.9, max) is what a punch under the store's lock
// would stall; max-free-ns is the longest Delete of the churn, which is
// what the call that crosses the threshold pays if it punches itself.
func BenchmarkGetDuringRelease(b *testing.B) {
	s := openTest(b, Config{DRAMBytes: 192 << 20, PageSize: 64 << 10, ReleaseBytes: 32 << 20})
	ctx := b.Context()
	blob := bigBlob(b, 8)
	var keys []chunk.Key
	for i := uint64(1); i <= 160; i++ {
		keys = append(keys, rekey(b, blob, i))
		if _, err := s.Put(ctx, blob, PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	live := keys[len(keys)-1]
	stop, done := make(chan struct{}), make(chan error, 1)
	var maxFree time.Duration
	go func() {
		own := bytes.Clone(blob)
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			for _, k := range keys[:64] {
				t0 := time.Now()
				if err := s.Delete(k); err != nil {
					done <- err
					return
				}
				maxFree = max(maxFree, time.Since(t0))
			}
			for i := range uint64(64) {
				rekey(b, own, i+1)
				if _, err := s.Put(ctx, own, PutOptions{}); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		h, err := s.Get(ctx, live)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		h.Release()
	}
	b.StopTimer()
	close(stop)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*999/1000].Nanoseconds()), "p99.9-ns")
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(float64(maxFree.Nanoseconds()), "max-free-ns")
}
