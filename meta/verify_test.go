package meta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// soloWithModels runs a one-node store in a new data directory, registers
// the models revs name (each entry's bytes hold its revision), closes it
// and returns its Config.
func soloWithModels(t *testing.T, revs ...string) Config {
	t.Helper()
	cfg := fastConfig("solo", t.TempDir())
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, rev := range revs {
		spec := testSpec(0)
		spec.WeightsRevision = rev
		if _, err := s.RegisterModel(ctxT(t), spec); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// flipIn flips one bit of the first occurrence of marker in the files
// matching pattern and reports the file.
func flipIn(t *testing.T, pattern, marker string) string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte(marker)); i >= 0 {
			b[i+len(marker)-1] ^= 0x01
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%q not found in %s", marker, pattern)
	return ""
}

// wantCorrupt opens cfg and wants ErrCorruptState naming what and
// telling the way out.
func wantCorrupt(t *testing.T, cfg Config, what string) {
	t.Helper()
	s, err := Open(ctxT(t), cfg)
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded on damaged raft state")
	}
	if !errors.Is(err, ErrCorruptState) {
		t.Fatalf("Open: %v, want ErrCorruptState", err)
	}
	t.Logf("Open refused: %v", err)
	for _, want := range []string{what, "mv " + filepath.Join(cfg.DataDir, "raft")} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Open: %v\nwant it to mention %q", err, want)
		}
	}
	// The refusal released the data directory: a fixed one opens.
	if err := os.RemoveAll(filepath.Join(cfg.DataDir, "raft")); err != nil {
		t.Fatal(err)
	}
	s, err = Open(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("Open after the raft state was moved away: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesFlippedLogEntry(t *testing.T) {
	cfg := soloWithModels(t, "rev-old-entry", "rev-later-1", "rev-later-2")
	flipIn(t, filepath.Join(cfg.DataDir, "raft", "wal", "*.wal"), "rev-old-entry")
	wantCorrupt(t, cfg, "raft log")
}

func TestOpenRefusesTruncatedLog(t *testing.T) {
	cfg := soloWithModels(t, "rev-a", "rev-b", "rev-c")
	segs, err := filepath.Glob(filepath.Join(cfg.DataDir, "raft", "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v %v", segs, err)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("rev-b"))
	if i < 0 {
		t.Fatal("entry not found")
	}
	if err := os.Truncate(segs[0], int64(i)); err != nil {
		t.Fatal(err)
	}
	wantCorrupt(t, cfg, "raft log")
}

func TestOpenRefusesDamagedSnapshot(t *testing.T) {
	for _, file := range []string{"state.bin", "meta.json"} {
		t.Run(file, func(t *testing.T) {
			cfg := soloWithModels(t, "rev-snap")
			// Close took a snapshot; damage the newest.
			snaps, err := filepath.Glob(filepath.Join(cfg.DataDir, "raft", "snapshots", "*"))
			if err != nil || len(snaps) == 0 {
				t.Fatalf("snapshots: %v %v", snaps, err)
			}
			newest := snaps[len(snaps)-1]
			marker := "rev-snap"
			if file == "meta.json" {
				marker = `"Index"`
			}
			flipIn(t, filepath.Join(newest, file), marker)
			wantCorrupt(t, cfg, newest)
		})
	}
}

func TestOpenRefusesDamagedWALMeta(t *testing.T) {
	cases := map[string]func(t *testing.T, path string){
		// A leaf page's header claims another page type: bbolt panics
		// with "invalid page type" when it reads it.
		"page type": func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			const pageSize = 4096
			for off := 2 * pageSize; off+pageSize <= len(b); off += pageSize {
				b[off+8], b[off+9] = 0, 0 // flags: no page type
			}
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"zeroed": func(t *testing.T, path string) {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, make([]byte, st.Size()), 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"removed": func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := soloWithModels(t, "rev-meta")
			path := filepath.Join(cfg.DataDir, "raft", "wal", metadb.FileName)
			damage(t, path)
			wantCorrupt(t, cfg, path)
		})
	}
}

// rawWAL opens a raft-wal log in dir without checksums, as kvmesh wrote
// it before entries had them.
func rawWAL(t *testing.T, dir string) (*raftwal.WAL, *metadb.BoltMetaDB) {
	t.Helper()
	md := &metadb.BoltMetaDB{}
	w, err := raftwal.Open(dir, raftwal.WithMetaStore(md))
	if err != nil {
		t.Fatal(err)
	}
	return w, md
}

func closeWAL(t *testing.T, w *raftwal.WAL, md *metadb.BoltMetaDB) {
	t.Helper()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
}

func testEntry(i uint64, data string) *raft.Log {
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(data), AppendedAt: time.Unix(1700000000, int64(i))}
}

// TestCheckedLogReadsOldLog: a log written before checksums still opens
// and reads; entries written after carry checksums, and from then on an
// entry without one is refused.
func TestCheckedLogReadsOldLog(t *testing.T) {
	dir := t.TempDir()
	w, md := rawWAL(t, dir)
	for i := uint64(1); i <= 3; i++ {
		if err := w.StoreLog(testEntry(i, "old-entry")); err != nil {
			t.Fatal(err)
		}
	}
	closeWAL(t, w, md)

	w, md = rawWAL(t, dir)
	cl, err := newCheckedLog(w, w)
	if err != nil {
		t.Fatal(err)
	}
	if cl.from != 4 {
		t.Fatalf("checksums from %d, want 4", cl.from)
	}
	in := testEntry(4, "new-entry")
	in.Extensions = []byte("middleware")
	if err := cl.StoreLogs([]*raft.Log{in, testEntry(5, "new-entry")}); err != nil {
		t.Fatal(err)
	}
	if string(in.Extensions) != "middleware" {
		t.Fatalf("StoreLogs changed the caller's entry: %q", in.Extensions)
	}
	// An entry stored without a checksum where one is due.
	if err := w.StoreLog(testEntry(6, "unchecked")); err != nil {
		t.Fatal(err)
	}
	closeWAL(t, w, md)

	w, md = rawWAL(t, dir)
	defer closeWAL(t, w, md)
	cl, err = newCheckedLog(w, w)
	if err != nil {
		t.Fatal(err)
	}
	if cl.from != 4 {
		t.Fatalf("checksums from %d after a reopen, want 4", cl.from)
	}
	var l raft.Log
	for i := uint64(1); i <= 5; i++ {
		if err := cl.GetLog(i, &l); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		want := testEntry(i, "old-entry")
		if i >= 4 {
			want = testEntry(i, "new-entry")
		}
		if i == 4 {
			want.Extensions = []byte("middleware")
		}
		if l.Index != want.Index || l.Term != want.Term || l.Type != want.Type || !bytes.Equal(l.Data, want.Data) ||
			!bytes.Equal(l.Extensions, want.Extensions) || !l.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("entry %d read back as %+v, want %+v", i, l, *want)
		}
	}
	if err := cl.GetLog(6, &l); !errors.Is(err, errEntryCorrupt) {
		t.Fatalf("entry without a checksum past %d: %v, want errEntryCorrupt", cl.from, err)
	}
	if err := verifyLog(dir, cl); !errors.Is(err, ErrCorruptState) || !strings.Contains(err.Error(), "entry 6") {
		t.Fatalf("verifyLog: %v, want ErrCorruptState at entry 6", err)
	}
}

// TestOpenEntry checks openEntry against every single-bit flip of a
// sealed entry's fields: each is caught, the intact entry reads back.
func TestOpenEntry(t *testing.T) {
	base := testEntry(7, `{"k":1,"m":{"w":32.66}}`)
	seal := func(l *raft.Log) *raft.Log {
		c := *l
		c.Extensions = sealEntry(l)
		return &c
	}
	good := seal(base)
	if err := openEntry(good, 7, 1); err != nil || good.Extensions != nil {
		t.Fatalf("intact entry: %v, extensions %q", err, good.Extensions)
	}
	for bit := range 8 * len(base.Data) {
		l := seal(base)
		l.Data = bytes.Clone(l.Data)
		l.Data[bit/8] ^= 1 << (bit % 8)
		if err := openEntry(l, 7, 1); !errors.Is(err, errEntryCorrupt) {
			t.Fatalf("data bit %d flipped: %v", bit, err)
		}
	}
	for bit := range 8 * entryTrailerLen {
		l := seal(base)
		l.Extensions[bit/8] ^= 1 << (bit % 8)
		if err := openEntry(l, 7, 1); !errors.Is(err, errEntryCorrupt) {
			t.Fatalf("trailer bit %d flipped: %v", bit, err)
		}
	}
	for name, mod := range map[string]func(l *raft.Log){
		"term":  func(l *raft.Log) { l.Term++ },
		"type":  func(l *raft.Log) { l.Type = raft.LogNoop },
		"time":  func(l *raft.Log) { l.AppendedAt = l.AppendedAt.Add(time.Nanosecond) },
		"index": func(l *raft.Log) { l.Index = 8 },
	} {
		l := seal(base)
		mod(l)
		if err := openEntry(l, 7, 1); !errors.Is(err, errEntryCorrupt) {
			t.Fatalf("%s changed: %v", name, err)
		}
	}
	// Below the first checksummed index an entry may have none.
	old := testEntry(7, "old")
	if err := openEntry(old, 7, 8); err != nil {
		t.Fatalf("old entry: %v", err)
	}
	if err := openEntry(testEntry(7, "old"), 7, 7); !errors.Is(err, errEntryCorrupt) {
		t.Fatalf("entry without a checksum at the first checksummed index: %v", err)
	}
}

// FuzzOpenEntry: openEntry never panics, accepts only what sealEntry
// wrote for that very entry (or an entry older than checksums), and
// sealEntry's output always opens to the entry it sealed.
func FuzzOpenEntry(f *testing.F) {
	f.Add([]byte(`{"k":1}`), []byte{}, uint64(3), uint64(1), false)
	f.Add([]byte("x"), append(entryTag[:], 1, 2, 3, 4), uint64(1), uint64(2), true)
	f.Fuzz(func(t *testing.T, data, ext []byte, index, from uint64, sealed bool) {
		l := &raft.Log{Index: index, Term: 2, Type: raft.LogCommand, Data: data, Extensions: ext, AppendedAt: time.Unix(5, 6)}
		if sealed {
			inner := bytes.Clone(ext)
			l.Extensions = sealEntry(l)
			if err := openEntry(l, index, from); err != nil {
				t.Fatalf("sealed entry: %v", err)
			}
			if len(inner) == 0 {
				inner = nil
			}
			if !bytes.Equal(l.Extensions, inner) || (l.Extensions == nil) != (inner == nil) {
				t.Fatalf("extensions %q, want %q", l.Extensions, inner)
			}
			return
		}
		ext = bytes.Clone(ext)
		err := openEntry(l, index, from)
		if err != nil {
			if !errors.Is(err, errEntryCorrupt) {
				t.Fatalf("error %v does not wrap errEntryCorrupt", err)
			}
			return
		}
		if index >= from || bytes.HasPrefix(ext, entryTag[:]) && len(ext) >= entryTrailerLen {
			// Accepted as checksummed: the stored sum is the entry's.
			if len(ext) < entryTrailerLen || !bytes.HasPrefix(ext, entryTag[:]) {
				t.Fatalf("entry %d (checksums from %d) without a checksum accepted", index, from)
			}
			if got, want := entryChecksum(l, l.Extensions), binary.LittleEndian.Uint32(ext[len(entryTag):]); got != want {
				t.Fatalf("accepted with checksum %08x, stored %08x", got, want)
			}
		}
	})
}

// TestOpenDataDirWithoutChecksums opens a data directory written before
// log entries had checksums (testdata/datadir-v0: a one-node cluster,
// models testSpec(0..2), stopped like a crash so that they are only in
// the log): it starts, applies them, and writes checksums from then on.
func TestOpenDataDirWithoutChecksums(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/datadir-v0")); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig("old", dir)
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, ok := s.WaitModel(ctxT(t), testSpec(i).Fingerprint()); !ok {
			t.Fatalf("model %d of the old log not applied", i)
		}
	}
	if _, err := s.RegisterModel(ctxT(t), testSpec(3)); err != nil {
		t.Fatal(err)
	}
	from := s.logs.from
	if err := s.close(false); err != nil {
		t.Fatal(err)
	}
	if from < 2 {
		t.Fatalf("checksums from entry %d: the old log's entries would need them", from)
	}
	s, err = Open(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if s.logs.from != from {
		t.Fatalf("checksums from %d after a reopen, was %d", s.logs.from, from)
	}
	if _, ok := s.WaitModel(ctxT(t), testSpec(3).Fingerprint()); !ok {
		t.Fatal("model written with a checksum not applied after a reopen")
	}
}

// TestOpenRefusesDamagedTerm: raft's term and vote in wal-meta.db that
// contradict the log it holds (as a bit flip in their values would; bbolt
// checksums no values).
func TestOpenRefusesDamagedTerm(t *testing.T) {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	for name, tc := range map[string]struct {
		set  map[string][]byte
		want string
	}{
		"term before the log's": {map[string][]byte{"CurrentTerm": one, "LastVoteTerm": one}, "current term 1 is before term 2"},
		"vote after the term":   {map[string][]byte{"LastVoteTerm": {0, 0, 0, 0, 0, 0, 0, 1}}, "after its current term"},
		"term of 7 bytes":       {map[string][]byte{"CurrentTerm": {2, 0, 0, 0, 0, 0, 0}}, "current term"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := soloWithModels(t, "rev-term")
			w, md := rawWAL(t, filepath.Join(cfg.DataDir, "raft", "wal"))
			for k, v := range tc.set {
				if err := w.Set([]byte(k), v); err != nil {
					t.Fatal(err)
				}
			}
			closeWAL(t, w, md)
			wantCorrupt(t, cfg, tc.want)
		})
	}
}
