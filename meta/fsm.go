package meta

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// fsm is the replicated state. raft calls Apply, Snapshot and Restore from
// its own goroutines, never two at once; each change builds a new immutable
// fsmState and publishes it with one atomic store, so readers (every Put
// and Get looks up its model) take no lock. The maps are copied on write:
// members and token records are few and change rarely; models may be many (a salt per
// tenant), so they live in shards and a registration copies one shard.
type fsm struct {
	onChange func() // called after every change
	cur      atomic.Pointer[fsmState]
}

// fsmState is one version of the state; it is never modified once
// published.
type fsmState struct {
	models   *modelTable
	settings Settings
	// settingsVersion is the log index of the command that last changed
	// settings: every replica reaches the same value at the same index,
	// whether it replayed the log or restored a snapshot (0: defaults, or
	// a snapshot from before versions were kept).
	settingsVersion uint64
	epoch           uint64
	members         map[string]ring.Member
	ring            *ring.Ring
	tokens          map[string]auth.Record // by ID; records are never mutated
	// left tombstones the nodes that left explicitly, by ID: the
	// incarnation that left and when (departure). A ring change that adds
	// the ID back (the leader does so only for another incarnation) clears
	// it; so does expiry (expireDepartures).
	left map[string]departure
}

func newFSM(onChange func()) *fsm {
	f := &fsm{onChange: onChange}
	f.reset(snapshotState{Settings: DefaultSettings()})
	return f
}

// snapshotState is the snapshot format and the FSM's whole state. It holds
// model specs, settings, ring members and API token records (hashes, never
// secrets): kilobytes, never tensor bytes. Tokens were added without a
// version bump: a snapshot without them is what version 1 always was.
type snapshotState struct {
	Version  int               `json:"version"`
	Models   []chunk.ModelSpec `json:"models"`
	Settings Settings          `json:"settings"`
	// SettingsVersion was added like Tokens: absent, it is 0.
	SettingsVersion uint64        `json:"settings_version,omitempty"`
	Epoch           uint64        `json:"epoch"`
	Members         []ring.Member `json:"members"`
	Tokens          []auth.Record `json:"tokens,omitempty"`
	// Left was added like Tokens: a snapshot without it has no
	// tombstones.
	Left []departure `json:"left,omitempty"`
}

// departure is a tombstone of a node that left explicitly.
type departure struct {
	ID          string `json:"id"`
	Incarnation uint64 `json:"incarnation"`
	// At is the time (Unix nanoseconds) carried by the last leave command
	// for this incarnation (stamped by the leader that proposed it, never
	// earlier than the leaver's own time), or, for a tombstone written before commands
	// carried one, by the first command after it that did. Zero: not
	// stamped yet. The tombstone expires DepartedTTL after it.
	At int64 `json:"at,omitempty"`
}

// DepartedTTL is how long a tombstone outlives the last leave command for
// its incarnation. Expiry is decided in the FSM from times carried in the
// log (a leave's or a ring change's At, stamped by the leader that
// proposed it: Store.applyLeave, reconcile), never from the clock of the
// replica that applies it, so every replica drops a tombstone at the same
// log index. Why a day is long enough that a stale
// gossip view of the departed incarnation cannot bring it back:
//   - the departing node sets Leaving in its own gossip metadata before its
//     gossip leave, so whatever gossip still carries of it says Leaving,
//     which reconcile honours without any tombstone;
//   - memberlist cannot revive a dead member: only the member itself can
//     refute its death, so once the process stops, no member holds that
//     incarnation alive for longer than failure detection (seconds) and
//     memberlist forgets it after GossipToTheDeadTime (30 s); an
//     incarnation is a process start time and never comes back;
//   - while the leader still sees that incarnation alive in gossip (a
//     drained node left running whose gossip leave failed), reconcile
//     re-commits the leave once the tombstone is half expired
//     (Store.refreshDepartures), so it expires only after the incarnation
//     has been out of the leader's sight for at least DepartedTTL/2: twelve
//     hours, against seconds of failure detection, the one-hour DeadGrace
//     ceiling anyone configures, and any clock skew between leaders.
const DepartedTTL = 24 * time.Hour

// expireDepartures applies the command time now (Unix nanoseconds; 0 for
// a command without one) to the tombstones: unstamped ones are stamped
// with it, and those whose At is DepartedTTL or more before it are
// dropped. It returns left itself when nothing changes, else a new map
// (the state is copy on write).
func expireDepartures(left map[string]departure, now int64) (map[string]departure, bool) {
	if now <= 0 {
		return left, false
	}
	var next map[string]departure
	for id, d := range left {
		expired := d.At != 0 && now-d.At >= int64(DepartedTTL)
		if d.At != 0 && !expired {
			continue
		}
		if next == nil {
			next = maps.Clone(left)
		}
		if expired {
			delete(next, id)
		} else {
			d.At = now
			next[id] = d
		}
	}
	if next == nil {
		return left, false
	}
	return next, true
}

func sortedDepartures(m map[string]departure) []departure {
	if len(m) == 0 {
		return nil
	}
	out := make([]departure, 0, len(m))
	for _, d := range m {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b departure) int { return cmp.Compare(a.ID, b.ID) })
	return out
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

func (f *fsm) reset(s snapshotState) { f.cur.Store(newState(s)) }

// newState builds the state a snapshot holds.
func newState(s snapshotState) *fsmState {
	st := &fsmState{
		models:   &modelTable{},
		settings: s.Settings,
		epoch:    s.Epoch,

		settingsVersion: s.SettingsVersion,
		members:         make(map[string]ring.Member, len(s.Members)),
		tokens:          make(map[string]auth.Record, len(s.Tokens)),
		left:            make(map[string]departure, len(s.Left)),
	}
	for _, d := range s.Left {
		st.left[d.ID] = d
	}
	for _, spec := range s.Models {
		st.models = st.models.with(spec.Fingerprint(), spec)
	}
	for _, m := range s.Members {
		st.members[m.ID] = m
	}
	for _, r := range s.Tokens {
		st.tokens[r.ID] = r
	}
	st.ring = ring.New(s.Epoch, sortedMembers(st.members))
	return st
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
	cur := f.cur.Load()
	next, err := c.apply(cur, l.Index)
	if err != nil {
		return err
	}
	if next != cur {
		f.cur.Store(next)
		if f.onChange != nil {
			f.onChange()
		}
	}
	return nil
}

func (f *fsm) model(fp chunk.Fingerprint) (chunk.ModelSpec, bool) {
	return f.cur.Load().models.get(fp)
}

func (f *fsm) modelList() []chunk.ModelSpec {
	return f.cur.Load().models.sorted()
}

func (f *fsm) currentSettings() Settings { return f.cur.Load().settings }

// versionedSettings returns the settings and their version, from one
// state.
func (f *fsm) versionedSettings() (Settings, uint64) {
	st := f.cur.Load()
	return st.settings, st.settingsVersion
}

func (f *fsm) currentRing() *ring.Ring { return f.cur.Load().ring }

func (f *fsm) member(id string) (ring.Member, bool) {
	m, ok := f.cur.Load().members[id]
	return m, ok
}

// departed returns the incarnation with which id left explicitly, if it
// did and has not come back since (nor expired).
func (f *fsm) departed(id string) (incarnation uint64, ok bool) {
	d, ok := f.cur.Load().left[id]
	return d.Incarnation, ok
}

// departedAll returns every tombstone, by ID. The map is part of the
// immutable state: callers must not modify it.
func (f *fsm) departedAll() map[string]departure { return f.cur.Load().left }

func (f *fsm) counts() (models, members, tokens int) {
	st := f.cur.Load()
	return st.models.n, len(st.members), len(st.tokens)
}

// token returns the record of id. The record's slices are shared with the
// state, which never modifies them; callers must not either.
func (f *fsm) token(id string) (auth.Record, bool) {
	r, ok := f.cur.Load().tokens[id]
	return r, ok
}

func (f *fsm) tokenList() []auth.Record {
	return sortedTokens(f.cur.Load().tokens)
}

func sortedTokens(m map[string]auth.Record) []auth.Record {
	if len(m) == 0 {
		return nil
	}
	out := make([]auth.Record, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b auth.Record) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// recordsEqual compares records field by field (they hold slices).
func recordsEqual(a, b auth.Record) bool {
	return a.ID == b.ID && bytes.Equal(a.Salt, b.Salt) && bytes.Equal(a.Hash, b.Hash) &&
		a.Scopes == b.Scopes && slices.Equal(a.Namespace, b.Namespace) && a.Name == b.Name &&
		a.Created.Equal(b.Created) && a.Expires.Equal(b.Expires)
}

func (f *fsm) state() snapshotState { return f.cur.Load().snapshot() }

// snapshot is st in the snapshot format.
func (st *fsmState) snapshot() snapshotState {
	return snapshotState{
		Version:  snapshotVersion,
		Models:   st.models.sorted(),
		Settings: st.settings,
		Epoch:    st.epoch,

		SettingsVersion: st.settingsVersion,
		Members:         sortedMembers(st.members),
		Tokens:          sortedTokens(st.tokens),
		Left:            sortedDepartures(st.left),
	}
}

// Snapshot implements raft.FSM; it captures the current version, and
// Persist writes it later while Apply goes on.
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

// MaxModels bounds the registry so that a snapshot (at most ~1.6 KB a
// spec with chunk.MaxSpecString) stays under maxSnapshotBytes.
const MaxModels = 50_000

// MaxTokens bounds the API token records (a few KiB each at most, with
// auth's bounds on names and namespaces), so that they and a full model
// registry stay under maxSnapshotBytes.
const MaxTokens = 8192

// maxSnapshotBytes bounds what Restore reads; real snapshots are kilobytes.
const maxSnapshotBytes = 128 << 20

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
	if len(s.Models) > MaxModels {
		return snapshotState{}, fmt.Errorf("meta: snapshot of %d models", len(s.Models))
	}
	for _, spec := range s.Models {
		if err := validateSpec(spec); err != nil {
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
	if len(s.Tokens) > MaxTokens {
		return snapshotState{}, fmt.Errorf("meta: snapshot of %d tokens", len(s.Tokens))
	}
	if len(s.Left) > maxMembers {
		return snapshotState{}, fmt.Errorf("meta: snapshot of %d departed nodes", len(s.Left))
	}
	clear(seen)
	for _, d := range s.Left {
		if err := validateMemberID(d.ID); err != nil {
			return snapshotState{}, fmt.Errorf("meta: snapshot departed node: %w", err)
		}
		if seen[d.ID] {
			return snapshotState{}, fmt.Errorf("meta: snapshot departed node %q twice", d.ID)
		}
		if d.At < 0 {
			return snapshotState{}, fmt.Errorf("meta: snapshot departed node %q at %d", d.ID, d.At)
		}
		seen[d.ID] = true
	}
	clear(seen)
	for i := range s.Tokens {
		r := &s.Tokens[i]
		if err := validateToken(r); err != nil {
			return snapshotState{}, fmt.Errorf("meta: snapshot token: %w", err)
		}
		if seen[r.ID] {
			return snapshotState{}, fmt.Errorf("meta: snapshot token %q twice", r.ID)
		}
		seen[r.ID] = true
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

// modelShards spreads the registry so a registration copies 1/256 of it.
const modelShards = 256

// modelTable is an immutable set of model specs by fingerprint; with
// returns a new table sharing all shards but one.
type modelTable struct {
	shards [modelShards]map[chunk.Fingerprint]chunk.ModelSpec
	n      int
}

func (t *modelTable) get(fp chunk.Fingerprint) (chunk.ModelSpec, bool) {
	s, ok := t.shards[fp.Lo%modelShards][fp]
	return s, ok
}

func (t *modelTable) with(fp chunk.Fingerprint, spec chunk.ModelSpec) *modelTable {
	next := *t
	i := fp.Lo % modelShards
	sh := make(map[chunk.Fingerprint]chunk.ModelSpec, len(t.shards[i])+1)
	maps.Copy(sh, t.shards[i])
	if _, ok := sh[fp]; !ok {
		next.n++
	}
	sh[fp] = spec
	next.shards[i] = sh
	return &next
}

func (t *modelTable) sorted() []chunk.ModelSpec {
	fps := make([]chunk.Fingerprint, 0, t.n)
	for _, sh := range &t.shards {
		for fp := range sh {
			fps = append(fps, fp)
		}
	}
	slices.SortFunc(fps, func(a, b chunk.Fingerprint) int {
		return cmp.Or(cmp.Compare(a.Hi, b.Hi), cmp.Compare(a.Lo, b.Lo))
	})
	out := make([]chunk.ModelSpec, len(fps))
	for i, fp := range fps {
		out[i], _ = t.get(fp)
	}
	return out
}
