//go:build !linux

package inject

import (
	"fmt"
	"os"

	"github.com/kvmesh/kvmesh/pagedkv"
)

func mapShm(*os.File, []int64, []pagedkv.CacheLayout, int64) ([][]byte, func(), fileID, string, error) {
	return nil, nil, fileID{}, "", fmt.Errorf("%w: shared-memory caches need linux", ErrUnsupported)
}

// ShmCache is a paged KV cache placed in shared memory (linux only).
type ShmCache struct {
	Layers [][]byte
	Memory Memory
}

// CreateShm is not available on this platform.
func CreateShm(path string, layers int, layouts []pagedkv.CacheLayout) (*ShmCache, error) {
	return nil, fmt.Errorf("%w: shared-memory caches need linux", ErrUnsupported)
}

// Close does nothing.
func (c *ShmCache) Close() error { return nil }
