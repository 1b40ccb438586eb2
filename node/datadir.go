package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrNodeIDMismatch is returned by Start when the data directory was
// first started under another node ID. Its raft log, ring membership and
// chunks belong to that ID: a node starting on them under a new name
// would join as a second member holding the first one's state.
var ErrNodeIDMismatch = errors.New("node: the data directory belongs to another node ID")

// nodeIDFileName is the file, in DataDir, that holds the node ID the
// directory was first started with.
const nodeIDFileName = "NODE_ID"

// checkNodeIDFile refuses a data directory that records another node ID.
// A directory without the file (a new one, or one from a build before
// the file existed) takes this node's ID, written durably before anything
// else opens the directory.
func checkNodeIDFile(dir, id string) error {
	path := filepath.Join(dir, nodeIDFileName)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := writeFileDurable(dir, nodeIDFileName, []byte(id+"\n")); err != nil {
			return fmt.Errorf("node: record the node ID: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("node: read the node ID: %w", err)
	}
	if have := strings.TrimSpace(string(b)); have != id {
		return fmt.Errorf("%w: %s was started as node %q, not %q: start it with -id %s, or give node %q a fresh data directory",
			ErrNodeIDMismatch, dir, have, id, have, id)
	}
	return nil
}

// writeFileDurable writes name in dir so that a crash leaves either the
// old file or the new one: a temporary file, synced, renamed over name,
// the directory synced.
func writeFileDurable(dir, name string, b []byte) error {
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: a no-op
	if _, err = tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	return err
}
