package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/kvtier"
	"github.com/kvmesh/kvmesh/node"
)

// Disk tier sizing when -disk is "auto" (the default): half of what the
// data directory's file system could give the tier at the first start
// (its free space plus the tier's own files), at most autoDiskMax, and no
// disk tier when that is under autoDiskMin. A disk tier is what lets a
// restart keep the chunks a node held: SIGTERM spills DRAM to it, and a
// start reads it back.
const (
	autoDisk    = "auto"
	autoDiskMax = 64 << 30
	autoDiskMin = 64 << 20
)

// diskBudgetFile, in the data directory, remembers the budget "auto"
// chose at the first start. Computing it again at every start would
// follow the free space, which the tier's own files take: a full disk
// tier would shrink its own budget at the next start, and the ring
// weight that the budget sets would change with every restart.
const diskBudgetFile = "disk-budget"

// diskBudget turns the -disk value into the disk tier's budget for
// dataDir: a size, 0 (no disk tier), or "auto" (see autoDisk). Either is
// checked against the file system: a budget larger than the file system
// could hold is clamped, with a warning.
func diskBudget(v, dataDir string, log *slog.Logger) (int64, error) {
	var b int64
	if v != autoDisk {
		var err error
		if b, err = ParseBytes(v); err != nil {
			return 0, fmt.Errorf("%w: -disk %q: want a byte size, 0 (no disk tier) or auto", ErrUsage, v)
		}
		if b == 0 {
			return 0, nil
		}
	}
	room, tier, err := diskRoom(dataDir)
	if err != nil {
		if v != autoDisk {
			// The size was given: an unknown free space changes nothing.
			return b, nil
		}
		return 0, fmt.Errorf("kvmeshd: -disk auto: free space of %s: %w", dataDir, err)
	}
	if v == autoDisk {
		if b, err = autoBudget(dataDir, room, log); err != nil {
			return 0, err
		}
		if b == 0 {
			return 0, nil
		}
	}
	// Leave a tenth of the room to the raft log and snapshots beside it.
	if limit := room - room/10; b > limit {
		log.Warn("kvmeshd: -disk budget exceeds what the data directory's file system can hold; clamping it",
			"disk", v, "budget", b, "clamped_to", limit, "free_plus_tier_bytes", room, "tier_bytes", tier, "data_dir", dataDir)
		b = limit
	}
	return b, nil
}

// autoBudget is -disk auto's budget: the one remembered in dataDir, else
// half of room (at most autoDiskMax; 0 under autoDiskMin), remembered.
func autoBudget(dataDir string, room int64, log *slog.Logger) (int64, error) {
	path := filepath.Join(dataDir, diskBudgetFile)
	if raw, err := os.ReadFile(path); err == nil {
		b, perr := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		if perr != nil || b < 0 {
			return 0, fmt.Errorf("kvmeshd: -disk auto: %s holds %q, not a byte count: remove it to size the disk tier again, or give -disk a size", path, raw)
		}
		return b, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("kvmeshd: -disk auto: %w", err)
	}
	b := min(room/2, autoDiskMax)
	if b < autoDiskMin {
		b = 0
	}
	// 0700, as node creates it: only the node's user reads its data.
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return 0, fmt.Errorf("kvmeshd: -disk auto: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(b, 10)+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("kvmeshd: -disk auto: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("kvmeshd: -disk auto: %w", err)
	}
	log.Info("kvmeshd: -disk auto sized the disk tier; the size is kept in the data directory for later starts",
		"budget", b, "free_plus_tier_bytes", room, "file", path)
	return b, nil
}

// diskRoom is what the data directory's file system could give the disk
// tier: its free space plus the bytes of the tier's own files (tier).
func diskRoom(dataDir string) (room, tier int64, err error) {
	_, free, err := kvtier.FSSpace(existingParent(dataDir))
	if err != nil {
		return 0, 0, err
	}
	tier, err = kvtier.DiskUsage(node.TierDir(dataDir))
	if err != nil {
		return 0, 0, err
	}
	return free + tier, tier, nil
}

// existingParent is dir or its nearest ancestor that exists: the data
// directory may not have been created yet.
func existingParent(dir string) string {
	dir = filepath.Clean(dir)
	for {
		if _, err := os.Stat(dir); err == nil || !errors.Is(err, os.ErrNotExist) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}
