package kvtier

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/pinned"
)

// blobs makes n distinct standalone entries of the given token count.
func blobs(t testing.TB, n, tokens int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = makeBlob(t, testFP, uint64(i+1)*7919, tokens, chunk.StandaloneContext(), 2)
	}
	return out
}

func mustGet(t *testing.T, s *Store, blob []byte) pinned.Bytes {
	t.Helper()
	h, err := s.Get(t.Context(), keyOf(t, blob))
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if !bytes.Equal(h.Bytes(), blob) {
		t.Fatal("get returned other bytes")
	}
	return h
}

func TestScatteredPagesGetOneView(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 64 * 4096})
	small := blobs(t, 32, 12) // 3 KiB + header: one page each
	for _, b := range small {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Free every other page so no two free pages touch.
	for i := 0; i < len(small); i += 2 {
		if err := s.Delete(keyOf(t, small[i])); err != nil {
			t.Fatal(err)
		}
	}
	// The background releaser may hold the freed pages for a punch due or
	// in flight; the big entry must find them free.
	testutil.WaitFor(t, "no release of freed pages due or running", func() bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.arena.reservedPages() == 0 && !s.arena.punchDue()
	})
	big := makeBlob(t, testFP, 99, 200, chunk.StandaloneContext(), 2) // 50 KiB: 13 pages
	if n := s.arena.pagesFor(len(big)); n < 4 {
		t.Fatalf("test setup: big entry takes %d pages", n)
	}
	if _, err := s.Put(ctx, big, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	runs := len(s.index[keyOf(t, big)].dram.span.runs)
	s.mu.Unlock()
	if runs < 2 {
		t.Fatalf("big entry got %d runs; want scattered pages", runs)
	}
	h := mustGet(t, s, big)
	if _, err := chunk.Verify(h.Bytes(), chunk.Limits{}); err != nil {
		t.Fatal(err)
	}
	h.Release()
	for i := 1; i < len(small); i += 2 {
		h := mustGet(t, s, small[i])
		h.Release()
	}
	if err := s.Delete(keyOf(t, big)); err != nil {
		t.Fatal(err)
	}
	checkBudgets(t, s)
}

func TestDemoteToDiskAndPromote(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := openTest(t, Config{DRAMBytes: 16 * 4096, DiskDir: dir, DiskBytes: 1 << 20})
	bs := blobs(t, 40, 12) // one page each; DRAM holds 16
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
		checkBudgets(t, s)
	}
	st := checkBudgets(t, s)
	if st.Entries != len(bs) || st.Tiers[TierDRAM].Demotions == 0 || st.Tiers[TierDisk].Entries == 0 {
		t.Fatalf("no demotion: %+v", st)
	}
	// Every entry is still there, bit for bit; disk hits come back to DRAM.
	for _, b := range bs {
		h := mustGet(t, s, b)
		h.Release()
		checkBudgets(t, s)
	}
	st = checkBudgets(t, s)
	if st.Tiers[TierDRAM].Promotions == 0 || st.Tiers[TierDisk].Hits == 0 {
		t.Fatalf("no promotion: %+v", st.Tiers)
	}
	if st.Tiers[TierDisk].Evictions != 0 || st.Entries != len(bs) {
		t.Fatalf("entries dropped with disk room left: %+v", st)
	}
}

func TestPinnedSurvivesPressure(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 8 * 4096})
	bs := blobs(t, 30, 12)
	if _, err := s.Put(ctx, bs[0], PutOptions{}); err != nil {
		t.Fatal(err)
	}
	held := mustGet(t, s, bs[0])
	for _, b := range bs[1:] {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Contains(keyOf(t, bs[0])) || !bytes.Equal(held.Bytes(), bs[0]) {
		t.Fatal("pinned entry evicted")
	}
	st := checkBudgets(t, s)
	if st.Tiers[TierDRAM].Evictions == 0 || st.Tiers[TierDRAM].PinnedBytes != int64(len(bs[0])) {
		t.Fatalf("stats: %+v", st.Tiers[TierDRAM])
	}
	// With every page pinned, a put has nowhere to go.
	var hs []pinned.Bytes
	for _, b := range bs {
		if h, err := s.Get(ctx, keyOf(t, b)); err == nil {
			hs = append(hs, h)
		}
	}
	extra := makeBlob(t, testFP, 12345, 12, chunk.StandaloneContext(), 2)
	if _, err := s.Put(ctx, extra, PutOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("put with all pinned: %v", err)
	}
	// A pinned entry that is deleted stays readable until released.
	if err := s.Delete(keyOf(t, bs[0])); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(held.Bytes(), bs[0]) {
		t.Fatal("deleted pinned bytes changed")
	}
	held.Release()
	for _, h := range hs {
		h.Release()
	}
	if _, err := s.Put(ctx, extra, PutOptions{}); err != nil {
		t.Fatalf("put after release: %v", err)
	}
	if st := checkBudgets(t, s); st.Tiers[TierDRAM].PinnedBytes != 0 {
		t.Fatalf("pinned bytes after release: %d", st.Tiers[TierDRAM].PinnedBytes)
	}
}

func TestOversizedGoesToDisk(t *testing.T) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 2 * 4096, DiskDir: t.TempDir(), DiskBytes: 1 << 20})
	big := makeBlob(t, testFP, 5, 200, chunk.StandaloneContext(), 2)
	bad := bytes.Clone(big)
	bad[len(bad)-3] ^= 8
	if _, err := s.Put(ctx, bad, PutOptions{}); !errors.Is(err, chunk.ErrCorrupt) {
		t.Fatalf("corrupt put to disk: %v", err)
	}
	if _, err := s.Put(ctx, big, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	h, tier, err := s.get(ctx, keyOf(t, big)) // cannot be promoted: a private copy
	if err != nil || tier != TierDisk || h.Held() {
		t.Fatalf("get: tier %v, pinned %v, %v", tier, h.Held(), err)
	}
	h.Release()
	s2 := openTest(t, Config{DRAMBytes: 2 * 4096})
	if _, err := s2.Put(ctx, big, PutOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("oversized put without disk: %v", err)
	}
}

// TestDiskRecovery crashes the disk tier every way a write can be cut
// short and checks what a restart keeps.
func TestDiskRecovery(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	cfg := Config{DRAMBytes: 4 * 4096, DiskDir: dir, DiskBytes: 1 << 20, PageSize: 4096, Logger: slog.New(slog.DiscardHandler)}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bs := blobs(t, 12, 12)
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// DRAM is gone with the process; the disk entries remain.
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, fileExt) {
			files = append(files, p)
		}
		return nil
	})
	if len(files) < 6 {
		t.Fatalf("only %d files on disk", len(files))
	}
	damage := []struct {
		name string
		do   func(p string) error
	}{
		{"truncated", func(p string) error { return os.Truncate(p, 100) }},
		{"torn tail", func(p string) error { fi, _ := os.Stat(p); return os.Truncate(p, fi.Size()-1) }},
		{"empty", func(p string) error { return os.Truncate(p, 0) }},
		{"bit flip in payload", func(p string) error {
			b, _ := os.ReadFile(p)
			b[len(b)-10] ^= 0x40
			return os.WriteFile(p, b, 0o644)
		}},
		{"bit flip in header", func(p string) error {
			b, _ := os.ReadFile(p)
			b[30] ^= 1
			return os.WriteFile(p, b, 0o644)
		}},
	}
	for i, d := range damage {
		if err := d.do(files[i]); err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
	}
	tmp := filepath.Join(dir, "00", ".tmp-12345")
	os.WriteFile(tmp, []byte("half a write"), 0o644)
	stray := filepath.Join(dir, "01", "not-an-entry"+fileExt)
	os.WriteFile(stray, bs[0], 0o644)

	s2 := openTest(t, cfg)
	st := s2.Stats()
	if want := len(files) - len(damage); st.Tiers[TierDisk].Entries != want {
		t.Fatalf("recovered %d entries, want %d", st.Tiers[TierDisk].Entries, want)
	}
	if d := st.Tiers[TierDisk].Damaged; d != uint64(len(damage)) {
		t.Fatalf("Damaged = %d after recovering %d damaged files", d, len(damage))
	}
	for _, p := range append(files[:len(damage):len(damage)], tmp, stray) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s not removed", p)
		}
	}
	// What is left reads back exactly; what was damaged is a miss.
	found := 0
	for _, b := range bs {
		h, err := s2.Get(ctx, keyOf(t, b))
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil || !bytes.Equal(h.Bytes(), b) {
			t.Fatalf("get after recovery: %v", err)
		}
		found++
		h.Release()
	}
	if found != st.Tiers[TierDisk].Entries {
		t.Fatalf("found %d of %d recovered entries", found, st.Tiers[TierDisk].Entries)
	}
	checkBudgets(t, s2)
}

// A file corrupted after startup is caught when read, never served.
func TestDiskCorruptionAtRead(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := openTest(t, Config{DRAMBytes: 2 * 4096, DiskDir: dir, DiskBytes: 1 << 20})
	bs := blobs(t, 6, 12)
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	var victim []byte
	for _, b := range bs {
		if e := s.index[keyOf(t, b)]; e.diskRel != "" {
			p := filepath.Join(dir, e.diskRel)
			raw, _ := os.ReadFile(p)
			raw[len(raw)-1] ^= 0xff
			os.WriteFile(p, raw, 0o644)
			victim = b
			break
		}
	}
	s.mu.Unlock()
	if victim == nil {
		t.Fatal("nothing on disk")
	}
	if _, err := s.Get(ctx, keyOf(t, victim)); !errors.Is(err, chunk.ErrCorrupt) || !errors.Is(err, ErrDamaged) {
		t.Fatalf("corrupt read: %v", err)
	}
	if s.Contains(keyOf(t, victim)) {
		t.Fatal("corrupt entry kept")
	}
	if d := s.Stats().Tiers[TierDisk].Damaged; d != 1 {
		t.Fatalf("Damaged = %d after one corrupt read", d)
	}
}

func TestFileNames(t *testing.T) {
	k := chunk.Key{Fingerprint: testFP, Content: chunk.ID{Lo: 0xab, Hi: 2},
		Context: chunk.Context{Kind: chunk.ContextWindow, Window: 64, ID: chunk.ID{Lo: 9, Hi: 1 << 63}}}
	rel := fileName(k, 0xdeadbeef, 12345, 7)
	if !strings.HasPrefix(rel, "ab/") {
		t.Fatalf("subdirectory of %s", rel)
	}
	k2, sum, size, gen, ok := parseFileName(rel)
	if !ok || k2 != k || sum != 0xdeadbeef || size != 12345 || gen != 7 {
		t.Fatalf("parse %s: %v %v %x %d", rel, ok, k2, sum, size)
	}
	for _, bad := range []string{"", "ab/", rel[:len(rel)-1], "cd" + rel[2:], strings.ToUpper(rel), rel + "x"} {
		if _, _, _, _, ok := parseFileName(bad); ok {
			t.Fatalf("parsed %q", bad)
		}
	}
}
