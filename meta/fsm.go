package meta

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// fsm is the replicated state. raft calls Apply, Snapshot and Restore from
// its own goroutines; readers take copies under mu. It owns the state; the
// Store only reads it.
type fsm struct {
	onChange func() // called after every change, outside mu

	mu       sync.RWMutex
	models   map[chunk.Fingerprint]chunk.ModelSpec
	settings Settings
	epoch    uint64
	members  map[string]ring.Member
	ring     *ring.Ring // rebuilt on each ring change; immutable
}

func newFSM(onChange func()) *fsm {
	f := &fsm{onChange: onChange}
	f.reset(snapshotState{Settings: DefaultSettings()})
	return f
}

// snapshotState is the snapshot format and the FSM's whole state. It holds
// model specs, settings and ring members: kilobytes, never tensor bytes.
type snapshotState struct {
	Version  int               `json:"version"`
	Models   []chunk.ModelSpec `json:"models"`
	Settings Settings          `json:"settings"`
	Epoch    uint64            `json:"epoch"`
	Members  []ring.Member     `json:"members"`
}

const snapshotVersion = 1

func sortedMembers(m map[string]ring.Member) []ring.Member {
	out := make([]ring.Member, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b ring.Member) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (f *fsm) reset(s snapshotState) {
	models := make(map[chunk.Fingerprint]chunk.ModelSpec, len(s.Models))
	for _, spec := range s.Models {
		models[spec.Fingerprint()] = spec
	}
	members := make(map[string]ring.Member, len(s.Members))
	for _, m := range s.Members {
		members[m.ID] = m
	}
	r := ring.New(s.Epoch, sortedMembers(members))
	f.mu.Lock()
	f.models, f.settings, f.epoch, f.members, f.ring = models, s.Settings, s.Epoch, members, r
	f.mu.Unlock()
}

// Apply implements raft.FSM. It returns nil or an error; an invalid
// command is refused with an error that reaches the writer, never a panic,
// and leaves the state as it was.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	c, err := decodeCommand(l.Data)
	if err != nil {
		return err
	}
	changed, err := f.apply(c)
	if err != nil {
		return err
	}
	if changed && f.onChange != nil {
		f.onChange()
	}
	return nil
}

func (f *fsm) apply(c command) (changed bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch c.kind {
	case kindRegisterModel:
		fp := c.model.Spec.Fingerprint()
		if _, ok := f.models[fp]; ok {
			return false, nil
		}
		f.models[fp] = c.model.Spec
		return true, nil
	case kindSetSettings:
		if f.settings == *c.settings {
			return false, nil
		}
		f.settings = *c.settings
		return true, nil
	case kindRingChange:
		rc := c.ring
		if rc.Epoch != f.epoch {
			return false, fmt.Errorf("%w: change for epoch %d, ring is at %d", ErrStaleEpoch, rc.Epoch, f.epoch)
		}
		if len(f.members)+len(rc.Upsert) > maxMembers {
			return false, fmt.Errorf("%w: ring would exceed %d members", ErrInvalidCommand, maxMembers)
		}
		next := make(map[string]ring.Member, len(f.members)+len(rc.Upsert))
		for id, m := range f.members {
			next[id] = m
		}
		diff := false
		for _, m := range rc.Upsert {
			if old, ok := next[m.ID]; !ok || old != m {
				diff = true
			}
			next[m.ID] = m
		}
		for _, id := range rc.Remove {
			if _, ok := next[id]; ok {
				diff = true
				delete(next, id)
			}
		}
		if !diff {
			// Nothing moves, so the epoch stays: an epoch always
			// means a different ring.
			return false, nil
		}
		f.epoch++
		f.members = next
		f.ring = ring.New(f.epoch, sortedMembers(next))
		return true, nil
	}
	return false, fmt.Errorf("%w: kind %v", ErrInvalidCommand, c.kind)
}

func (f *fsm) model(fp chunk.Fingerprint) (chunk.ModelSpec, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s, ok := f.models[fp]
	return s, ok
}

func (f *fsm) modelList() []chunk.ModelSpec {
	f.mu.RLock()
	type fpSpec struct {
		fp   chunk.Fingerprint
		spec chunk.ModelSpec
	}
	l := make([]fpSpec, 0, len(f.models))
	for fp, s := range f.models {
		l = append(l, fpSpec{fp, s})
	}
	f.mu.RUnlock()
	slices.SortFunc(l, func(a, b fpSpec) int {
		return cmp.Or(cmp.Compare(a.fp.Hi, b.fp.Hi), cmp.Compare(a.fp.Lo, b.fp.Lo))
	})
	out := make([]chunk.ModelSpec, len(l))
	for i := range l {
		out[i] = l[i].spec
	}
	return out
}

func (f *fsm) currentSettings() Settings {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.settings
}

func (f *fsm) currentRing() *ring.Ring {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.ring
}

func (f *fsm) member(id string) (ring.Member, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.members[id]
	return m, ok
}

func (f *fsm) counts() (models, members int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.models), len(f.members)
}

func (f *fsm) state() snapshotState {
	models := f.modelList()
	f.mu.RLock()
	defer f.mu.RUnlock()
	return snapshotState{
		Version:  snapshotVersion,
		Models:   models,
		Settings: f.settings,
		Epoch:    f.epoch,
		Members:  sortedMembers(f.members),
	}
}

// Snapshot implements raft.FSM; the copy is taken here, the write happens
// later in Persist without holding mu.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{s: f.state()}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s, err := decodeSnapshot(rc)
	if err != nil {
		return err
	}
	f.reset(s)
	if f.onChange != nil {
		f.onChange()
	}
	return nil
}

// maxSnapshotBytes bounds what Restore reads; real snapshots are kilobytes.
const maxSnapshotBytes = 64 << 20

func decodeSnapshot(r io.Reader) (snapshotState, error) {
	var s snapshotState
	dec := json.NewDecoder(io.LimitReader(r, maxSnapshotBytes))
	if err := dec.Decode(&s); err != nil {
		return snapshotState{}, fmt.Errorf("meta: decode snapshot: %w", err)
	}
	if s.Version != snapshotVersion {
		return snapshotState{}, fmt.Errorf("meta: snapshot version %d, want %d", s.Version, snapshotVersion)
	}
	if err := s.Settings.Validate(); err != nil {
		return snapshotState{}, fmt.Errorf("meta: snapshot settings: %w", err)
	}
	for _, spec := range s.Models {
		if err := spec.Validate(); err != nil {
			return snapshotState{}, fmt.Errorf("meta: snapshot model: %w", err)
		}
	}
	if len(s.Members) > maxMembers {
		return snapshotState{}, fmt.Errorf("meta: snapshot of %d members", len(s.Members))
	}
	seen := make(map[string]bool, len(s.Members))
	for _, m := range s.Members {
		if err := validateMember(m); err != nil {
			return snapshotState{}, fmt.Errorf("meta: snapshot member: %w", err)
		}
		if seen[m.ID] {
			return snapshotState{}, fmt.Errorf("meta: snapshot member %q twice", m.ID)
		}
		seen[m.ID] = true
	}
	return s, nil
}

type fsmSnapshot struct{ s snapshotState }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("meta: write snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}
