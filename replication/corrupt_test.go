package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pinned"
)

// corrupt damages b's copy of key in place, as a write into the store's
// memory would: the header's magic, or one payload byte.
func (c *cluster) corrupt(t *testing.T, node string, key chunk.Key, header bool) {
	t.Helper()
	damage := func(blob []byte) { blob[len(blob)-1] ^= 0x01 }
	if header {
		damage = func(blob []byte) { blob[0] ^= 0xff }
	}
	if !c.stores[node].Damage(key, damage) {
		t.Fatalf("%s lacks %v", node, key)
	}
}

// TestReadFallsBackOnCorruptLocalCopy: a local copy whose header or
// payload was damaged after it was stored is not served: Read returns a
// replica's copy, drops the damaged one and repairs this node.
func TestReadFallsBackOnCorruptLocalCopy(t *testing.T) {
	for _, header := range []bool{true, false} {
		c := newCluster(t, []string{"a", "b", "c"}, nil)
		blob, key := makeBlob(t, 3, 0)
		if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(key)) == 3 })
		c.corrupt(t, "b", key, header)
		rr, err := c.reps["b"].Read(t.Context(), key)
		if err != nil {
			t.Fatalf("header %v: %v", header, err)
		}
		if !bytes.Equal(rr.Blob.Bytes(), blob) || rr.From == "b" {
			t.Errorf("header %v: read %d bytes from %s, want the stored blob from a replica", header, rr.Blob.Len(), rr.From)
		}
		rr.Blob.Release()
		c.waitRepairs()
		got, err := c.stores["b"].Get(t.Context(), key)
		if err != nil || !bytes.Equal(got.Bytes(), blob) {
			t.Errorf("header %v: b not repaired: %v", header, err)
		}
		if m := c.reps["b"].Metrics(); m.LocalCorrupt != 1 {
			t.Errorf("header %v: LocalCorrupt %d, want 1", header, m.LocalCorrupt)
		}
	}
}

// TestServeFetchCorruptCopyIsAbsent: a copy whose header was damaged is
// answered as absent to a peer (which then reads another replica and
// repairs this node), dropped, and repaired here.
func TestServeFetchCorruptCopyIsAbsent(t *testing.T) {
	c := newCluster(t, []string{"a", "b", "c"}, nil)
	blob, key := makeBlob(t, 4, 0)
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(key)) == 3 })
	c.corrupt(t, "b", key, true)
	if _, err := c.reps["b"].ServeFetch(t.Context(), key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("fetch of a damaged copy: %v, want ErrNotFound", err)
	}
	c.waitRepairs()
	testutil.WaitFor(t, "b repaired", func() bool {
		got, err := c.stores["b"].Get(t.Context(), key)
		return err == nil && bytes.Equal(got.Bytes(), blob)
	})
}

// failingStore is an InmemStore whose reads of bad fail as a disk tier's
// read of a damaged file does, until the key is deleted.
type failingStore struct {
	*InmemStore
	mu  sync.Mutex
	bad map[chunk.Key]bool
}

func (s *failingStore) Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error) {
	s.mu.Lock()
	bad := s.bad[key]
	s.mu.Unlock()
	if bad {
		return pinned.Bytes{}, fmt.Errorf("%w: reading the file of %v", chunk.ErrCorrupt, key)
	}
	return s.InmemStore.Get(ctx, key)
}

func (s *failingStore) Delete(key chunk.Key) error {
	s.mu.Lock()
	delete(s.bad, key)
	s.mu.Unlock()
	return s.InmemStore.Delete(key)
}

// TestReadDropsCopyTheStoreFindsCorrupt: a local copy the store itself
// fails to read as corrupt is dropped and repaired too, not read around
// for ever (a repair would find the same bytes stored and keep them).
func TestReadDropsCopyTheStoreFindsCorrupt(t *testing.T) {
	fs := &failingStore{InmemStore: NewInmemStore(), bad: map[chunk.Key]bool{}}
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, conf *Config) {
		if id == "b" {
			conf.Store = fs
		}
	})
	c.stores["b"] = fs.InmemStore
	blob, key := makeBlob(t, 5, 0)
	if _, err := c.reps["a"].Write(t.Context(), blob); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the key on three replicas", func() bool { return len(c.holders(key)) == 3 })
	fs.mu.Lock()
	fs.bad[key] = true
	fs.mu.Unlock()
	rr, err := c.reps["b"].Read(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	rr.Blob.Release()
	c.waitRepairs()
	got, err := fs.Get(t.Context(), key)
	if err != nil || !bytes.Equal(got.Bytes(), blob) {
		t.Errorf("b not repaired: %v", err)
	}
	if m := c.reps["b"].Metrics(); m.LocalCorrupt != 1 {
		t.Errorf("LocalCorrupt %d, want 1", m.LocalCorrupt)
	}
}
