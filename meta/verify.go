package meta

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"
)

// ErrCorruptState: the node's raft state on disk (its log, a snapshot or
// raft-wal's meta store) is damaged. Open refuses to start on it; the
// error says which file and what recovers the node.
var ErrCorruptState = errors.New("meta: raft state on disk is damaged")

// corruptError is ErrCorruptState for what (a file or a log entry) in the
// data directory dataDir, with the way out.
func corruptError(dataDir, what string, err error) error {
	raftDir := filepath.Join(dataDir, "raft")
	return fmt.Errorf("%w: %s: %w; the node cannot start on it. Its metadata is a copy of the cluster's: "+
		"move %s aside (mv %s %s.damaged), keep the rest of the data directory, and start the node again "+
		"with the same ID: it receives the metadata from the leader (docs/DEPLOY.md, \"Damaged Raft state\")",
		ErrCorruptState, what, err, raftDir, raftDir, raftDir)
}

// verifyWALMeta reads every page of raft-wal's bolt meta store in dir
// before raft-wal opens it. bbolt panics on a damaged page (invalid page
// type, a page out of bounds) and its checks run in goroutines of its own;
// reading the file here, with faults turned into panics, makes such damage
// an error. It also refuses segment files without a meta store: raft-wal
// would start an empty log over them and delete them.
func verifyWALMeta(dataDir, dir string) (err error) {
	path := filepath.Join(dir, metadb.FileName)
	st, serr := os.Stat(path)
	if serr != nil && !errors.Is(serr, fs.ErrNotExist) {
		return fmt.Errorf("meta: %s: %w", path, serr)
	}
	if serr != nil || st.Size() == 0 {
		segs, gerr := filepath.Glob(filepath.Join(dir, "*.wal"))
		if gerr != nil || len(segs) == 0 {
			return nil // a new log
		}
		return corruptError(dataDir, path, fmt.Errorf("missing or empty, but the log has %d segment files", len(segs)))
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = corruptError(dataDir, path, fmt.Errorf("bolt: %v", p))
		}
	}()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockWait})
	if err != nil {
		if errors.Is(err, fs.ErrPermission) || errors.Is(err, bbolt.ErrTimeout) {
			return fmt.Errorf("meta: open %s: %w", path, err)
		}
		return corruptError(dataDir, path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bbolt.Tx) error {
		for _, name := range []string{metadb.MetaBucket, metadb.StableBucket} {
			if tx.Bucket([]byte(name)) == nil {
				return fmt.Errorf("bucket %q missing", name)
			}
		}
		return tx.ForEach(func(_ []byte, b *bbolt.Bucket) error { return walkBucket(b) })
	})
	if err != nil {
		return corruptError(dataDir, path, err)
	}
	return nil
}

// lockWait bounds the wait for bolt's file lock; the directory lock
// (lockDir) already keeps other kvmeshd processes out.
const lockWait = 5 * time.Second

// walkBucket reads every key and value of b and its nested buckets.
func walkBucket(b *bbolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			nb := b.Bucket(k)
			if nb == nil {
				return fmt.Errorf("key %q is neither a value nor a bucket", k)
			}
			return walkBucket(nb)
		}
		return nil
	})
}

// verifyLog reads every entry of log, checking it (checkedLog.GetLog), so
// that a node never starts on a log raft would apply a damaged entry of,
// or panic on when it reaches it.
func verifyLog(dataDir string, log *checkedLog) error {
	first, err := log.FirstIndex()
	if err != nil {
		return corruptError(dataDir, "raft log", err)
	}
	last, err := log.LastIndex()
	if err != nil {
		return corruptError(dataDir, "raft log", err)
	}
	if last == 0 {
		return nil
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := log.GetLog(i, &l); err != nil {
			return corruptError(dataDir, fmt.Sprintf("raft log %s, entry %d of %d-%d", filepath.Join(dataDir, "raft", "wal"), i, first, last), err)
		}
	}
	return nil
}

// verifySnapshots opens every snapshot in snaps (raft checks the state
// file's CRC against its meta.json) and decodes it. raft itself would
// restore an older snapshot when the newest is damaged, or skip one whose
// meta.json is unreadable, and the node would start on older state than
// it had.
func verifySnapshots(dataDir string, snaps *raft.FileSnapshotStore, retain int) error {
	dir := filepath.Join(dataDir, "raft", "snapshots")
	list, err := snaps.List()
	if err != nil {
		return corruptError(dataDir, dir, err)
	}
	ids := make([]string, 0, len(list))
	for _, m := range list {
		ids = append(ids, m.ID)
		if err := verifySnapshot(snaps, m.ID); err != nil {
			return corruptError(dataDir, filepath.Join(dir, m.ID), err)
		}
	}
	if len(list) >= retain {
		return nil // raft lists only the newest retain snapshots
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("meta: %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") && !slices.Contains(ids, e.Name()) {
			return corruptError(dataDir, filepath.Join(dir, e.Name()), errors.New("its meta.json cannot be read"))
		}
	}
	return nil
}

// verifySnapshot opens snapshot id and decodes its state.
func verifySnapshot(snaps *raft.FileSnapshotStore, id string) error {
	_, rc, err := snaps.Open(id)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = decodeSnapshot(rc)
	return err
}

// verifyStable checks raft's term and vote in the stable store (raft-wal
// keeps them in wal-meta.db, whose values bbolt does not checksum) against
// what raft guarantees: the current term is at least the term of every
// entry and snapshot this node holds (raft persists a term before it
// accepts anything of it), and the term of the last vote is not beyond
// it. A flip that lowers the term could let the node vote twice in a term.
func verifyStable(dataDir, walDir string, stable raft.StableStore, log *checkedLog, snaps []*raft.SnapshotMeta) error {
	path := filepath.Join(walDir, metadb.FileName)
	cur, err := stable.GetUint64([]byte("CurrentTerm"))
	if err != nil {
		return corruptError(dataDir, path, fmt.Errorf("raft's current term: %w", err))
	}
	voted, err := stable.GetUint64([]byte("LastVoteTerm"))
	if err != nil {
		return corruptError(dataDir, path, fmt.Errorf("raft's last vote term: %w", err))
	}
	if voted > cur {
		return corruptError(dataDir, path, fmt.Errorf("raft voted in term %d, after its current term %d", voted, cur))
	}
	var held uint64
	if len(snaps) > 0 {
		held = snaps[0].Term
	}
	last, err := log.LastIndex()
	if err != nil {
		return corruptError(dataDir, "raft log", err)
	}
	if last > 0 {
		var l raft.Log
		if err := log.GetLog(last, &l); err != nil {
			return corruptError(dataDir, "raft log", err)
		}
		held = max(held, l.Term)
	}
	if cur < held {
		return corruptError(dataDir, path, fmt.Errorf("raft's current term %d is before term %d of the state it holds", cur, held))
	}
	return nil
}
