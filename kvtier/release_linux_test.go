//go:build linux

package kvtier

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestReleaseInBackground: the call that makes a release of freed pages
// due does not punch them itself; the Store's releaser does, without the
// lock, and Close waits for a punch in flight and stops the releaser. The
// punch is held (punchHook) until the deletes have returned and Close has
// begun: a delete that punched itself would never return.
func TestReleaseInBackground(t *testing.T) {
	const release = 4 << 20
	s := openTest(t, Config{DRAMBytes: 16 << 20, PageSize: 64 << 10, ReleaseBytes: release})
	keys := fillStore(t, s, bigBlob(t, 8))
	held := holdPunch(s)
	defer held.letGo()

	deleted := make(chan error, 1)
	go func() { deleted <- deleteUntilRelease(s, keys[:len(keys)-1]) }()
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		held.letGo()
		t.Fatal("the delete that made a release due did not return: it runs the punch itself")
	}
	select {
	case <-held.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the releaser did not start the release")
	}

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	testutil.WaitForWithin(t, 20*time.Second, "Close to begin", func() bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.closed
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a punch in flight", err)
	default:
	}
	held.letGo()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.releaseDone:
	default:
		t.Fatal("the releaser still runs after Close")
	}
	s.mu.RLock()
	released, reserved := s.released, s.arena.reservedPages()
	s.mu.RUnlock()
	if released < release || reserved != 0 {
		t.Fatalf("after Close: %d bytes released, %d pages reserved; want >= %d and 0", released, reserved, release)
	}
}
