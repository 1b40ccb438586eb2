package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// ErrLeftCluster is returned by Start when the data directory belongs to
// a node that left the cluster (Leave, the last step of a drain) and
// Config.Rejoin is not set. A drained node is out for good: its chunks
// went to their new owners and the leader tombstoned it; an operator who
// restarts it by mistake (a process supervisor, an old unit file) should
// hear so rather than see it join again silently and take a share of the
// ring. Starting with Rejoin (kvmeshd -rejoin) makes it a member again;
// a fresh data directory makes it a new node.
var ErrLeftCluster = errors.New("node: this data directory belongs to a node that left the cluster")

// leftMarkerName is the file, in DataDir, that records a committed leave.
const leftMarkerName = "LEFT"

// leftMarker is what the marker file says.
type leftMarker struct {
	NodeID      string    `json:"node_id"`
	Incarnation uint64    `json:"incarnation"`
	At          time.Time `json:"at"`
}

// writeLeftMarker records that this node left, durably: written to a
// temporary file, synced, renamed over the marker, directory synced. The
// leave is committed already, so a failure here is only logged by the
// caller (the next start then rejoins, as before the marker existed).
func writeLeftMarker(dir string, m leftMarker) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := writeFileDurable(dir, leftMarkerName, append(b, '\n')); err != nil {
		return fmt.Errorf("node: write leave marker: %w", err)
	}
	return nil
}

// checkLeftMarker refuses to start on the data directory of a node that
// left, unless rejoin; with rejoin it reports the leave, whose marker
// clearLeftMarker removes once the start has succeeded (a rejoin whose
// start fails keeps it, so the next start without -rejoin still refuses).
func checkLeftMarker(dir string, rejoin bool) (*leftMarker, error) {
	path := filepath.Join(dir, leftMarkerName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node: read leave marker: %w", err)
	}
	var m leftMarker
	if err := json.Unmarshal(b, &m); err != nil {
		// Still a leave: the file exists only because one committed.
		m = leftMarker{}
	}
	if !rejoin {
		when := "at an unknown time"
		if !m.At.IsZero() {
			when = "at " + m.At.UTC().Format(time.RFC3339)
		}
		return &m, fmt.Errorf("%w (node %q left %s; %s exists): start with -rejoin (Config.Rejoin) to make it a member again, or use a fresh data directory",
			ErrLeftCluster, m.NodeID, when, path)
	}
	return &m, nil
}

// clearLeftMarker removes the leave marker of a node that rejoined.
func clearLeftMarker(dir string) error {
	if err := os.Remove(filepath.Join(dir, leftMarkerName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("node: remove leave marker: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("node: remove leave marker: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Left is closed once a drain has taken this node out of the cluster
// (Drain without keepMembership: its leave committed) and has finished,
// its last sweep included. The node then serves nothing the cluster
// needs, and the process running it may close it and exit (kvmeshd
// does). A Leave outside a drain does not close it.
func (n *Node) Left() <-chan struct{} { return n.left }

// markLeft closes Left.
func (n *Node) markLeft() { n.leftOnce.Do(func() { close(n.left) }) }
