package replication

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// tomb is what a node remembers about a key beyond its store: a delete
// (deleted) or a write that came after one, at a coordinator time.
type tomb struct {
	at      int64
	deleted bool
}

// tombstones is the set of recent deletes (and of writes that overrode
// them), kept for a TTL. With a path it is persisted as an append-only log
// of fixed-size records, compacted on open and when it grows.
type tombstones struct {
	ttl  time.Duration
	now  func() time.Time
	path string

	mu sync.Mutex
	m  map[chunk.Key]tomb
	// deleted is the newest version deleted of each opaque value that
	// has one in m (versions.go), rebuilt from m on every compaction. m
	// keeps only that version's tombstone of the value: it stands for
	// the older versions' (every one is refused), so a key SET again and
	// again holds one tombstone, not one per SET.
	deleted map[valueOf]chunk.ID
	f       *os.File // nil without a path
	records int      // records in the log file
}

// valueOf names an opaque value, all its versions.
type valueOf struct {
	fp      chunk.Fingerprint
	content chunk.ID
}

// noteLocked records k's delete in deleted.
func (ts *tombstones) noteLocked(k chunk.Key, t tomb) {
	if !t.deleted || k.Context.Kind != chunk.ContextOpaque {
		return
	}
	v := valueOf{k.Fingerprint, k.Content}
	if old, ok := ts.deleted[v]; !ok || old.Less(k.Context.ID) {
		ts.deleted[v] = k.Context.ID
	}
}

// newestDeleted returns the newest version deleted of the opaque value
// key is a version of.
func (ts *tombstones) newestDeleted(key chunk.Key) (chunk.ID, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	v, ok := ts.deleted[valueOf{key.Fingerprint, key.Content}]
	return v, ok
}

// tombRecordBytes is the size of one log record: key (16+16+1+4+16), at
// (8), flags (1) and a CRC-32C of the preceding bytes (4).
const tombRecordBytes = 66

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func encodeTomb(b []byte, k chunk.Key, t tomb) []byte {
	var rec [tombRecordBytes]byte
	putKey(rec[:], k)
	binary.LittleEndian.PutUint64(rec[53:], uint64(t.at))
	if t.deleted {
		rec[61] = 1
	}
	binary.LittleEndian.PutUint32(rec[62:], crc32.Checksum(rec[:62], crcTable))
	return append(b, rec[:]...)
}

// errBadRecord marks a corrupt tombstone or hint record.
var errBadRecord = errors.New("replication: corrupt record")

func decodeTomb(rec []byte) (chunk.Key, tomb, error) {
	if len(rec) != tombRecordBytes {
		return chunk.Key{}, tomb{}, fmt.Errorf("%w: tombstone of %d bytes", errBadRecord, len(rec))
	}
	if crc32.Checksum(rec[:62], crcTable) != binary.LittleEndian.Uint32(rec[62:]) {
		return chunk.Key{}, tomb{}, fmt.Errorf("%w: tombstone checksum", errBadRecord)
	}
	if rec[61] > 1 {
		return chunk.Key{}, tomb{}, fmt.Errorf("%w: tombstone flags %d", errBadRecord, rec[61])
	}
	k, err := getKey(rec)
	if err != nil {
		return k, tomb{}, err
	}
	return k, tomb{at: int64(binary.LittleEndian.Uint64(rec[53:])), deleted: rec[61] == 1}, nil
}

// keyBytes is the encoded size of a chunk.Key.
const keyBytes = 53

func putKey(b []byte, k chunk.Key) {
	binary.LittleEndian.PutUint64(b[0:], k.Fingerprint.Lo)
	binary.LittleEndian.PutUint64(b[8:], k.Fingerprint.Hi)
	binary.LittleEndian.PutUint64(b[16:], k.Content.Lo)
	binary.LittleEndian.PutUint64(b[24:], k.Content.Hi)
	b[32] = byte(k.Context.Kind)
	binary.LittleEndian.PutUint32(b[33:], k.Context.Window)
	binary.LittleEndian.PutUint64(b[37:], k.Context.ID.Lo)
	binary.LittleEndian.PutUint64(b[45:], k.Context.ID.Hi)
}

func getKey(b []byte) (chunk.Key, error) {
	k := chunk.Key{
		Fingerprint: chunk.Fingerprint{Lo: binary.LittleEndian.Uint64(b[0:]), Hi: binary.LittleEndian.Uint64(b[8:])},
		Content:     chunk.ID{Lo: binary.LittleEndian.Uint64(b[16:]), Hi: binary.LittleEndian.Uint64(b[24:])},
		Context: chunk.Context{
			Kind:   chunk.ContextKind(b[32]),
			Window: binary.LittleEndian.Uint32(b[33:]),
			ID:     chunk.ID{Lo: binary.LittleEndian.Uint64(b[37:]), Hi: binary.LittleEndian.Uint64(b[45:])},
		},
	}
	if !k.Context.Kind.Valid() {
		return k, fmt.Errorf("%w: context kind %d", errBadRecord, b[32])
	}
	return k, nil
}

// openTombstones loads the log at path ("" for memory only), dropping
// expired and torn records, and rewrites it compacted.
func openTombstones(path string, ttl time.Duration, now func() time.Time) (*tombstones, error) {
	ts := &tombstones{ttl: ttl, now: now, path: path, m: make(map[chunk.Key]tomb), deleted: make(map[valueOf]chunk.ID)}
	if path == "" {
		return ts, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("replication: tombstones: %w", err)
	}
	f, err := os.Open(path)
	switch {
	case err == nil:
		br := bufio.NewReader(f)
		var rec [tombRecordBytes]byte
		for {
			if _, err := io.ReadFull(br, rec[:]); err != nil {
				break // EOF, or a torn last record
			}
			k, t, err := decodeTomb(rec[:])
			if err != nil {
				continue
			}
			if old, ok := ts.m[k]; !ok || t.at >= old.at {
				ts.m[k] = t
			}
		}
		f.Close()
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("replication: tombstones: %w", err)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if err := ts.compactLocked(); err != nil {
		return nil, err
	}
	return ts, nil
}

func (ts *tombstones) expiredLocked(t tomb, now int64) bool {
	return t.at+int64(ts.ttl) < now
}

// compactLocked drops expired records and rewrites the log.
func (ts *tombstones) compactLocked() error {
	now := ts.now().UnixNano()
	clear(ts.deleted)
	for k, t := range ts.m {
		if ts.expiredLocked(t, now) {
			delete(ts.m, k)
		} else {
			ts.noteLocked(k, t)
		}
	}
	for k, t := range ts.m {
		if v, ok := ts.deleted[valueOf{k.Fingerprint, k.Content}]; ok && t.deleted && k.Context.ID.Less(v) {
			delete(ts.m, k) // an older version's, implied by v's
		}
	}
	if ts.path == "" {
		return nil
	}
	buf := make([]byte, 0, len(ts.m)*tombRecordBytes)
	for k, t := range ts.m {
		buf = encodeTomb(buf, k, t)
	}
	tmp := ts.path + ".tmp"
	if err := writeFileSync(tmp, buf); err != nil {
		return fmt.Errorf("replication: tombstones: %w", err)
	}
	if ts.f != nil {
		ts.f.Close()
		ts.f = nil
	}
	if err := os.Rename(tmp, ts.path); err != nil {
		return fmt.Errorf("replication: tombstones: %w", err)
	}
	f, err := os.OpenFile(ts.path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("replication: tombstones: %w", err)
	}
	ts.f, ts.records = f, len(ts.m)
	return nil
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// get returns the live record of k.
func (ts *tombstones) get(k chunk.Key) (tomb, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.m[k]
	if ok && ts.expiredLocked(t, ts.now().UnixNano()) {
		delete(ts.m, k)
		return tomb{}, false
	}
	return t, ok
}

// set records t for k (unless a newer record exists) and persists it.
func (ts *tombstones) set(k chunk.Key, at int64, deleted bool) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if old, ok := ts.m[k]; ok && old.at > at {
		return nil
	}
	if deleted && k.Context.Kind == chunk.ContextOpaque {
		if v, ok := ts.deleted[valueOf{k.Fingerprint, k.Content}]; ok {
			if k.Context.ID.Less(v) {
				return nil // implied by the newer version's tombstone
			}
			if v != k.Context.ID {
				delete(ts.m, chunk.Key{Fingerprint: k.Fingerprint, Content: k.Content, Context: chunk.OpaqueContextAt(v)})
			}
		}
	}
	t := tomb{at: at, deleted: deleted}
	ts.m[k] = t
	ts.noteLocked(k, t)
	if ts.f == nil {
		return nil
	}
	if _, err := ts.f.Write(encodeTomb(nil, k, t)); err != nil {
		return err
	}
	ts.records++
	if ts.records > 2*len(ts.m)+1024 {
		return ts.compactLocked()
	}
	return nil
}

// tombItem is a record as list returns it.
type tombItem struct {
	key chunk.Key
	tomb
}

// list returns the live records, sorted by key.
func (ts *tombstones) list() []tombItem {
	ts.mu.Lock()
	now := ts.now().UnixNano()
	out := make([]tombItem, 0, len(ts.m))
	for k, t := range ts.m {
		if !ts.expiredLocked(t, now) {
			out = append(out, tombItem{k, t})
		}
	}
	ts.mu.Unlock()
	slices.SortFunc(out, func(a, b tombItem) int { return chunk.CompareKeys(a.key, b.key) })
	return out
}

func (ts *tombstones) close() error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.f == nil {
		return nil
	}
	err := ts.f.Close()
	ts.f = nil
	return err
}
