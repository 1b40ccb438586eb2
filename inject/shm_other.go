//go:build !linux

package inject

import (
	"fmt"

	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
)

func mapShm(path string, _ bool, _ []int64, _ []pagedkv.CacheLayout, _ int64) ([][]byte, func(), error) {
	return nil, nil, fmt.Errorf("%w: shared-memory caches need linux (%s)", ErrUnsupported, path)
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
