package meta

import (
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
)

// registerModel adds a model spec to the registry, keyed by its
// fingerprint; registering a spec again changes nothing.
type registerModel struct {
	Spec chunk.ModelSpec `json:"spec"`
}

func (registerModel) kind() cmdKind { return kindRegisterModel }

func (c registerModel) validate() error { return validateSpec(c.Spec) }

func (c registerModel) apply(cur *fsmState, _ uint64) (*fsmState, error) {
	fp := c.Spec.Fingerprint()
	if _, ok := cur.models.get(fp); ok {
		return cur, nil
	}
	if cur.models.n >= MaxModels {
		return cur, fmt.Errorf("%w: registry holds %d models, the most allowed", ErrInvalidCommand, MaxModels)
	}
	next := *cur
	next.models = cur.models.with(fp, c.Spec)
	return &next, nil
}

// validateSpec is chunk's validation (string limits included: they keep
// snapshots bounded too) as a command error.
func validateSpec(spec chunk.ModelSpec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCommand, err)
	}
	return nil
}
