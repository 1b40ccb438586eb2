package cudakern

import (
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/chunk"
)

// RopeTables shares RopeTables between callers: one per spec fingerprint,
// rebuilt larger (at least doubling) when a caller needs more positions, so
// a node serving many requests of one model builds its table a handful of
// times. The zero value is ready to use; it is safe for concurrent use.
// Tables it returned stay valid after it replaces them.
type RopeTables struct {
	mu     sync.Mutex
	tables map[chunk.Fingerprint]*RopeTable
}

// Get returns a table for spec with MaxPositions >= positions.
//
// Dynamic NTK tables depend on the sequence length (see NewRopeTable): up to
// Scaling.MaxPositions they are all the same and shared; beyond it every
// length has its own inverse frequencies, so Get builds one of exactly
// positions and does not keep it.
func (c *RopeTables) Get(spec chunk.ModelSpec, positions int) (*RopeTable, error) {
	if positions <= 0 || positions > MaxTablePositions {
		return nil, fmt.Errorf("%w: positions %d out of range 1..%d", ErrInvalidSpec, positions, MaxTablePositions)
	}
	limit := MaxTablePositions
	if spec.Scaling.Type == "dynamic" {
		if positions > spec.Scaling.MaxPositions {
			return NewRopeTable(spec, positions)
		}
		limit = spec.Scaling.MaxPositions
	}
	fp := spec.Fingerprint()
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.tables[fp]; t != nil && t.MaxPositions() >= positions {
		return t, nil
	}
	n := positions
	if t := c.tables[fp]; t != nil {
		n = max(n, min(2*t.MaxPositions(), limit))
	}
	t, err := NewRopeTable(spec, n)
	if err != nil {
		return nil, err
	}
	if c.tables == nil {
		c.tables = make(map[chunk.Fingerprint]*RopeTable)
	}
	c.tables[fp] = t
	return t, nil
}
