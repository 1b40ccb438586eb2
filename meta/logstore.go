package meta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/hashicorp/raft"
)

// checkedLog is the raft log store: raft-wal with a checksum on every
// entry. raft-wal checks only its last batch when it opens a log, so a bit
// flip in an older entry would otherwise be read back, and applied, as a
// valid command. The checksum rides in the entry's Extensions (raft
// carries them opaquely and kvmesh sets none): StoreLogs adds it, GetLog
// checks and removes it, so raft, its peers and the FSM never see it.
//
// A log written before checksums existed has entries without one. The
// first index written with checksums is kept in the stable store
// (checksumFromKey); an entry below it may lack a checksum, one at or
// above it must have one.
type checkedLog struct {
	raft.LogStore
	from uint64 // entries at or above it must carry a checksum
}

// checksumFromKey names, in raft-wal's stable store, the first log index
// this data directory wrote with entry checksums.
var checksumFromKey = []byte("kvmesh_entry_checksums_from")

// endAtCloseKey names, in the stable store, the log's last index when the
// node last stopped cleanly; 0 while it runs. raft-wal takes a tail cut
// short for a write a crash tore and drops it, so a log truncated on disk
// would otherwise start with committed entries missing.
var endAtCloseKey = []byte("kvmesh_log_end_at_close")

// entryTag starts a checksummed entry's Extensions: a magic and a format
// version, then the CRC-32C of the entry (entryChecksum), then the
// Extensions raft handed in.
var entryTag = [4]byte{'k', 'v', 'c', 1}

const entryTrailerLen = len(entryTag) + 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errEntryCorrupt: an entry read back from the log fails its check.
var errEntryCorrupt = errors.New("raft log entry is damaged")

// newCheckedLog wraps log, whose stable store is stable. A log that has no
// checksumFromKey yet (a new one, or one written before checksums) gets
// it: the index after its last entry.
func newCheckedLog(log raft.LogStore, stable raft.StableStore) (*checkedLog, error) {
	from, err := stable.GetUint64(checksumFromKey)
	if err != nil {
		return nil, fmt.Errorf("meta: read %s: %w", checksumFromKey, err)
	}
	if from == 0 {
		last, err := log.LastIndex()
		if err != nil {
			return nil, err
		}
		from = last + 1
		if err := stable.SetUint64(checksumFromKey, from); err != nil {
			return nil, fmt.Errorf("meta: write %s: %w", checksumFromKey, err)
		}
	}
	return &checkedLog{LogStore: log, from: from}, nil
}

// checkEnd fails when the log ends before the index recorded by the
// last clean stop (recordEnd), then clears the record: after a crash the
// tail raft-wal drops was never acknowledged by this node as durable,
// while after a clean stop every entry was.
func (c *checkedLog) checkEnd(stable raft.StableStore) error {
	want, err := stable.GetUint64(endAtCloseKey)
	if err != nil {
		return fmt.Errorf("meta: read %s: %w", endAtCloseKey, err)
	}
	last, err := c.LastIndex()
	if err != nil {
		return err
	}
	if last < want {
		return fmt.Errorf("%w: the log ends at entry %d, but it ended at entry %d when the node last stopped", errEntryCorrupt, last, want)
	}
	if want != 0 {
		if err := stable.SetUint64(endAtCloseKey, 0); err != nil {
			return fmt.Errorf("meta: write %s: %w", endAtCloseKey, err)
		}
	}
	return nil
}

// recordEnd records the log's last index for checkEnd; raft must have
// stopped writing.
func (c *checkedLog) recordEnd(stable raft.StableStore) error {
	last, err := c.LastIndex()
	if err != nil {
		return err
	}
	return stable.SetUint64(endAtCloseKey, last)
}

// IsMonotonic tells raft that the log never has gaps when it restores a
// snapshot (raft-wal's property, which raft checks through this method).
func (c *checkedLog) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// StoreLog implements raft.LogStore.
func (c *checkedLog) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore. It stores copies: raft keeps using
// the entries it passed, without the checksum.
func (c *checkedLog) StoreLogs(logs []*raft.Log) error {
	out := make([]*raft.Log, len(logs))
	copies := make([]raft.Log, len(logs))
	for i, l := range logs {
		copies[i] = *l
		copies[i].Extensions = sealEntry(l)
		out[i] = &copies[i]
	}
	return c.LogStore.StoreLogs(out)
}

// GetLog implements raft.LogStore. An entry that fails its check is an
// error wrapping errEntryCorrupt; raft never sees its contents.
func (c *checkedLog) GetLog(index uint64, l *raft.Log) error {
	if err := c.LogStore.GetLog(index, l); err != nil {
		return err
	}
	if err := openEntry(l, index, c.from); err != nil {
		*l = raft.Log{}
		return err
	}
	return nil
}

// sealEntry returns l's Extensions with the trailer that openEntry checks.
func sealEntry(l *raft.Log) []byte {
	ext := make([]byte, entryTrailerLen+len(l.Extensions))
	copy(ext, entryTag[:])
	binary.LittleEndian.PutUint32(ext[len(entryTag):], entryChecksum(l, l.Extensions))
	copy(ext[entryTrailerLen:], l.Extensions)
	return ext
}

// openEntry checks the entry l read at index (with checksums required
// from index from on) and takes the checksum off its Extensions.
func openEntry(l *raft.Log, index, from uint64) error {
	if l.Index != index {
		return fmt.Errorf("%w: index %d holds an entry for index %d", errEntryCorrupt, index, l.Index)
	}
	ext := l.Extensions
	if len(ext) < entryTrailerLen || !bytes.Equal(ext[:len(entryTag)], entryTag[:]) {
		if index >= from {
			return fmt.Errorf("%w: entry %d has no checksum (checksums are written from entry %d on)", errEntryCorrupt, index, from)
		}
		return nil // written before checksums
	}
	want := binary.LittleEndian.Uint32(ext[len(entryTag):])
	inner := ext[entryTrailerLen:]
	if got := entryChecksum(l, inner); got != want {
		return fmt.Errorf("%w: entry %d: checksum %08x, stored %08x", errEntryCorrupt, index, got, want)
	}
	if len(inner) == 0 {
		inner = nil // as raft-wal decodes empty Extensions
	}
	l.Extensions = inner
	return nil
}

// entryChecksum is the CRC-32C of every field of l that raft-wal stores,
// with ext for its Extensions.
func entryChecksum(l *raft.Log, ext []byte) uint32 {
	var hdr [8 + 8 + 1 + 8 + 4 + 8 + 8]byte
	b := hdr[:0]
	b = binary.LittleEndian.AppendUint64(b, l.Index)
	b = binary.LittleEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	// Seconds and nanoseconds: raft-wal keeps the instant, not the
	// monotonic reading or the location.
	b = binary.LittleEndian.AppendUint64(b, uint64(l.AppendedAt.Unix()))
	b = binary.LittleEndian.AppendUint32(b, uint32(l.AppendedAt.Nanosecond()))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(l.Data)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ext)))
	sum := crc32.Update(0, castagnoli, b)
	sum = crc32.Update(sum, castagnoli, l.Data)
	return crc32.Update(sum, castagnoli, ext)
}
