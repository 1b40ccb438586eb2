package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Disk tier sizing when -disk is "auto" (the default): half the free
// space of the data directory's file system, at most autoDiskMax, and no
// disk tier when that is under autoDiskMin. A disk tier is what lets a
// restart keep the chunks a node held: SIGTERM spills DRAM to it, and a
// start reads it back.
const (
	autoDisk    = "auto"
	autoDiskMax = 64 << 30
	autoDiskMin = 64 << 20
)

// diskBudget turns the -disk value into the disk tier's budget for
// dataDir: a size, 0 (no disk tier), or "auto".
func diskBudget(v, dataDir string) (int64, error) {
	if v != autoDisk {
		b, err := ParseBytes(v)
		if err != nil {
			return 0, fmt.Errorf("%w: -disk %q: want a byte size, 0 (no disk tier) or auto", ErrUsage, v)
		}
		return b, nil
	}
	free, err := freeBytes(existingParent(dataDir))
	if err != nil {
		return 0, fmt.Errorf("kvmeshd: -disk auto: free space of %s: %w", dataDir, err)
	}
	b := min(free/2, autoDiskMax)
	if b < autoDiskMin {
		return 0, nil
	}
	return b, nil
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
