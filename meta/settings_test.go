package meta

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/chunk"
)

// TestFSMSettingsVersion: the settings version is the log index of the
// last change; a conditional change applies only at the version it
// expects (else ErrSettingsVersion and nothing changes); an unconditional
// one always applies; one merged from settings read earlier applies only
// if they are still those; the version survives a snapshot.
func TestFSMSettingsVersion(t *testing.T) {
	ver := func(v uint64) *uint64 { return &v }
	s1 := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecRaw}
	s2 := Settings{ReplicationFactor: 3, WriteQuorum: 2, Codec: chunk.CodecLossless}
	s3 := Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecInt8}
	steps := []struct {
		name     string
		index    uint64
		cmd      setSettings
		err      error
		settings Settings
		version  uint64
	}{
		{"conditional on the defaults", 3, setSettings{Settings: s1, IfVersion: ver(0)}, nil, s1, 3},
		{"stale: another admin's version 0", 5, setSettings{Settings: s2, IfVersion: ver(0)}, ErrSettingsVersion, s1, 3},
		{"conditional on version 3", 6, setSettings{Settings: s2, IfVersion: ver(3)}, nil, s2, 6},
		{"same settings, right version: no change", 8, setSettings{Settings: s2, IfVersion: ver(6)}, nil, s2, 6},
		{"same settings, wrong version: refused", 9, setSettings{Settings: s2, IfVersion: ver(3)}, ErrSettingsVersion, s2, 6},
		{"unconditional wins whatever the version", 10, setSettings{Settings: s3, IfVersion: nil}, nil, s3, 10},
		{"a version from the future is refused", 11, setSettings{Settings: s1, IfVersion: ver(99)}, ErrSettingsVersion, s3, 10},
		{"merged from other settings: refused", 12, setSettings{Settings: s1, IfSettings: &s2}, ErrSettingsVersion, s3, 10},
		{"merged from the settings held", 13, setSettings{Settings: s1, IfSettings: &s3}, nil, s1, 13},
	}
	f := newFSM(nil)
	for _, st := range steps {
		res := f.Apply(&raft.Log{Index: st.index, Type: raft.LogCommand, Data: mustEncode(t, st.cmd)})
		err, _ := res.(error)
		if st.err == nil && err != nil || st.err != nil && !errors.Is(err, st.err) {
			t.Fatalf("%s: Apply = %v, want %v", st.name, res, st.err)
		}
		if s, v := f.versionedSettings(); s != st.settings || v != st.version {
			t.Fatalf("%s: settings %+v version %d, want %+v %d", st.name, s, v, st.settings, st.version)
		}
	}
	g := restored(t, f)
	if _, v := g.versionedSettings(); v != 13 {
		t.Fatalf("restored version %d, want 13", v)
	}
	// A command written before conditional changes existed is the bare
	// settings; it still decodes, unconditional.
	old := append([]byte{cmdVersion, byte(kindSetSettings)}, `{"replication_factor":2,"write_quorum":2,"codec":1}`...)
	c, err := decodeCommand(old)
	if want := (setSettings{Settings: Settings{2, 2, chunk.CodecRaw}}); err != nil || c != want {
		t.Fatalf("old command: %+v %v", c, err)
	}
}

// TestSetSettingsAtVersion: two admins read the same version through different
// nodes and both change the settings conditionally: the first commit
// wins, the second fails with ErrSettingsVersion whichever node it went
// through (the follower forwards it to the leader) and changes nothing.
func TestSetSettingsAtVersion(t *testing.T) {
	c := newCluster(t, 3)
	for _, id := range ids(3) {
		c.start(id)
	}
	c.waitAgree(ids(3))
	a := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecRaw}
	b := Settings{ReplicationFactor: 3, WriteQuorum: 3, Codec: chunk.CodecLossless}
	c.withRoles(func(l, f *Store) error {
		ctx := ctxT(t)
		_, v := l.VersionedSettings()
		if _, fv := f.WaitSettingsVersion(ctx, v); fv != v {
			return errors.New("follower did not reach the leader's settings version")
		}
		// Admin 1, through the follower; admin 2, through the leader,
		// with the version both read.
		first, second := a, b
		if cur := l.Settings(); cur == a {
			first, second = b, a // a repeated step: change something
		}
		if err := f.SetSettings(ctx, first, AtVersion(v)); err != nil {
			return err
		}
		if err := l.SetSettings(ctx, second, AtVersion(v)); !errors.Is(err, ErrSettingsVersion) {
			t.Fatalf("second admin through the leader: %v, want ErrSettingsVersion", err)
		}
		nv := uint64(0)
		for _, s := range []*Store{l, f} {
			got, sv := s.WaitSettingsVersion(ctx, v+1)
			if got != first || sv <= v {
				t.Fatalf("%s holds %+v at version %d, want %+v after %d", s.NodeID(), got, sv, first, v)
			}
			nv = sv
		}
		// The stale version through the follower too: forwarded to the
		// leader, or refused at once since the follower holds a newer one.
		if err := f.SetSettings(ctx, second, AtVersion(v)); !errors.Is(err, ErrSettingsVersion) {
			t.Fatalf("second admin through the follower: %v, want ErrSettingsVersion", err)
		}
		if got, sv := l.VersionedSettings(); got != first || sv != nv {
			t.Fatalf("after refused changes: %+v at %d, want %+v at %d", got, sv, first, nv)
		}
		// With the new version the change goes through.
		if err := f.SetSettings(ctx, second, AtVersion(nv)); err != nil {
			return err
		}
		if got, _ := f.WaitSettingsVersion(ctx, nv+1); got != second {
			t.Fatalf("follower holds %+v, want %+v", got, second)
		}
		return nil
	})
}

// unclearForwarder forwards every command, but once armed it gives the
// next settings change no clear answer: it forwards instead (nil: the
// change itself) and reports a timeout, as a forward to a loaded leader
// can after the leader committed.
type unclearForwarder struct {
	inner Forwarder
	mu    sync.Mutex
	armed bool
	fired bool
	// instead is what the armed forward commits in place of the change
	// (nil: the change itself), e.g. another admin's change.
	instead []byte
}

func (f *unclearForwarder) arm(instead []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed, f.fired, f.instead = true, false, instead
}

func (f *unclearForwarder) didFire() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

func (f *unclearForwarder) Apply(ctx context.Context, addr string, cmd []byte) error {
	f.mu.Lock()
	lose := f.armed
	instead := f.instead
	if c, err := decodeCommand(cmd); err != nil || c.kind() != kindSetSettings {
		lose = false
	}
	if lose {
		f.armed, f.fired = false, true
	}
	f.mu.Unlock()
	if !lose {
		return f.inner.Apply(ctx, addr, cmd)
	}
	if instead != nil {
		cmd = instead
	}
	if err := f.inner.Apply(ctx, addr, cmd); err != nil {
		return err
	}
	return fmt.Errorf("forward to %s: %w", addr, context.DeadlineExceeded)
}

// TestSetSettingsUnclearFirstTry: a conditional change whose first
// forward committed but answered with a timeout succeeds (its retry is
// refused by its own condition, and the node's state shows the change
// landed); when what committed meanwhile was another admin's change, the
// conflict is still reported.
func TestSetSettingsUnclearFirstTry(t *testing.T) {
	c := newCluster(t, 3)
	fwd := &unclearForwarder{inner: c.fwd}
	c.tweak = func(cfg *Config) { cfg.Forward = fwd }
	for _, id := range ids(3) {
		c.start(id)
	}
	c.waitAgree(ids(3))
	a := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecRaw}
	b := Settings{ReplicationFactor: 3, WriteQuorum: 2, Codec: chunk.CodecLossless}
	d := Settings{ReplicationFactor: 1, WriteQuorum: 1, Codec: chunk.CodecInt8}
	ctx := ctxT(t)
	tests := []struct {
		name    string
		set     func(f *Store, from Settings, v uint64) error
		to      Settings
		instead *Settings // another admin's change committed by the lost forward
	}{
		{"if version, landed", func(f *Store, _ Settings, v uint64) error { return f.SetSettings(ctx, a, AtVersion(v)) }, a, nil},
		{"from settings, landed", func(f *Store, from Settings, _ uint64) error { return f.SetSettings(ctx, b, AtSettings(from)) }, b, nil},
		{"if version, another admin won", func(f *Store, _ Settings, v uint64) error { return f.SetSettings(ctx, a, AtVersion(v)) }, d, &d},
	}
	for _, tc := range tests {
		f := c.follower()
		from, v := c.leader().VersionedSettings()
		if got, fv := f.WaitSettingsVersion(ctx, v); fv != v {
			t.Fatalf("%s: follower at %+v version %d, want version %d", tc.name, got, fv, v)
		}
		var instead []byte
		if tc.instead != nil {
			instead = mustEncode(t, setSettings{Settings: *tc.instead})
		}
		fwd.arm(instead)
		err := tc.set(f, from, v)
		if !fwd.didFire() {
			t.Skipf("%s: %s led by the time it wrote (leadership moved): the forward under test was not taken", tc.name, f.NodeID())
		}
		if tc.instead != nil {
			if !errors.Is(err, ErrSettingsVersion) {
				t.Fatalf("%s: %v, want ErrSettingsVersion", tc.name, err)
			}
		} else if err != nil {
			t.Fatalf("%s: %v, want nil (the first try committed)", tc.name, err)
		}
		if got, sv := f.WaitSettingsVersion(ctx, v+1); got != tc.to || sv <= v {
			t.Fatalf("%s: follower holds %+v at version %d, want %+v after %d", tc.name, got, sv, tc.to, v)
		}
	}
}

// TestPreconditionCommand: each precondition writes the condition the FSM
// checks (the command fields of testdata/commands.golden).
func TestPreconditionCommand(t *testing.T) {
	set := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecLossless}
	from := DefaultSettings()
	v := uint64(12)
	for _, tc := range []struct {
		pre  Precondition
		want setSettings
	}{
		{AnyVersion(), setSettings{Settings: set}},
		{Precondition{}, setSettings{Settings: set}},
		{AtVersion(12), setSettings{Settings: set, IfVersion: &v}},
		{AtSettings(from), setSettings{Settings: set, IfSettings: &from}},
	} {
		if got := tc.pre.command(set); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: command %+v, want %+v", tc.pre, got, tc.want)
		}
	}
}
