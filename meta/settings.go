package meta

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/chunk"
)

// Settings are the cluster-wide knobs every node reads from the metadata.
type Settings struct {
	// ReplicationFactor is R, the number of replicas of each chunk.
	ReplicationFactor int `json:"replication_factor"`
	// WriteQuorum is W, the replicas that must hold a chunk before a put is
	// acknowledged; 1 <= W <= R.
	WriteQuorum int `json:"write_quorum"`
	// Codec is the codec new entries are encoded with.
	Codec chunk.Codec `json:"codec"`
}

// Default settings until the first SetSettings.
const (
	DefaultReplicationFactor = 3
	DefaultWriteQuorum       = 2
	// MaxReplicationFactor bounds R; more replicas than this is a typo.
	MaxReplicationFactor = 16
)

// DefaultSettings returns R=3, W=2 and the lossless codec: entries are
// stored and moved compressed, bit-exact.
func DefaultSettings() Settings {
	return Settings{ReplicationFactor: DefaultReplicationFactor, WriteQuorum: DefaultWriteQuorum, Codec: chunk.CodecLossless}
}

// Validate reports why s cannot be the cluster's settings.
func (s Settings) Validate() error {
	switch {
	case s.ReplicationFactor < 1 || s.ReplicationFactor > MaxReplicationFactor:
		return fmt.Errorf("%w: replication factor %d out of range 1..%d", ErrInvalidCommand, s.ReplicationFactor, MaxReplicationFactor)
	case s.WriteQuorum < 1 || s.WriteQuorum > s.ReplicationFactor:
		return fmt.Errorf("%w: write quorum %d out of range 1..%d", ErrInvalidCommand, s.WriteQuorum, s.ReplicationFactor)
	case s.Codec < chunk.CodecRaw || s.Codec > chunk.CodecFP8:
		return fmt.Errorf("%w: unknown codec %v", ErrInvalidCommand, s.Codec)
	}
	return nil
}

// Precondition is what must still hold when raft applies a settings write
// (Store.SetSettings) for the write to take effect. One that no longer
// holds fails the write with ErrSettingsVersion and changes nothing. The
// zero value is AnyVersion.
type Precondition struct {
	kind     preconditionKind
	version  uint64   // for AtVersion
	settings Settings // for AtSettings
}

type preconditionKind uint8

const (
	anyVersion preconditionKind = iota
	atVersion
	atSettings
)

// AnyVersion is no precondition: the write applies whatever the settings
// are by then, and the last writer wins.
func AnyVersion() Precondition { return Precondition{} }

// AtVersion holds while the settings are still at version v (the version
// VersionedSettings returned with them): a compare and set, so that two
// admins changing the settings at once cannot silently overwrite each
// other.
func AtVersion(v uint64) Precondition { return Precondition{kind: atVersion, version: v} }

// AtSettings holds while the settings are still from: the compare and set
// for a change merged into settings read earlier. It compares the settings
// themselves, so every replica decides alike even where a version is not
// known (a replica restored from a snapshot written before versions were
// kept).
func AtSettings(from Settings) Precondition { return Precondition{kind: atSettings, settings: from} }

func (p Precondition) String() string {
	switch p.kind {
	case atVersion:
		return fmt.Sprintf("at version %d", p.version)
	case atSettings:
		return fmt.Sprintf("at settings %+v", p.settings)
	}
	return "any version"
}

// command is the raft command that writes set under p.
func (p Precondition) command(set Settings) setSettings {
	c := setSettings{Settings: set}
	switch p.kind {
	case atVersion:
		v := p.version
		c.IfVersion = &v
	case atSettings:
		from := p.settings
		c.IfSettings = &from
	}
	return c
}

// SetSettings replaces the cluster settings with set if pre still holds
// when raft applies the change; otherwise it fails with
// ErrSettingsVersion and changes nothing. Invalid settings fail with an
// error wrapping ErrInvalidCommand. A write that would change nothing
// returns nil without reaching the log, and so does one this node can
// already tell pre refuses (with ErrSettingsVersion): settings versions
// only grow.
func (s *Store) SetSettings(ctx context.Context, set Settings, pre Precondition) error {
	if err := set.Validate(); err != nil {
		return err
	}
	cur, v := s.fsm.versionedSettings()
	switch pre.kind {
	case anyVersion:
		if cur == set {
			return nil
		}
	case atVersion:
		if v > pre.version {
			// Versions only grow: no need to ask the leader.
			return fmt.Errorf("%w: settings are at version %d, not %d", ErrSettingsVersion, v, pre.version)
		}
		if v == pre.version && cur == set {
			return nil
		}
	case atSettings:
		if set == pre.settings {
			return nil
		}
		if cur != pre.settings {
			return fmt.Errorf("%w: settings changed since they were read", ErrSettingsVersion)
		}
	}
	return s.writeSettings(ctx, set, pre)
}

// VersionedSettings returns the cluster settings and their version: the
// log index of the command that last changed them (0 until then, or when
// they were last changed before versions were kept).
func (s *Store) VersionedSettings() (Settings, uint64) { return s.fsm.versionedSettings() }

// WaitSettingsVersion waits until this node has applied settings of at
// least version, or ctx ends, and returns the settings it holds then.
func (s *Store) WaitSettingsVersion(ctx context.Context, version uint64) (Settings, uint64) {
	s.waitFor(ctx, func() bool {
		_, v := s.fsm.versionedSettings()
		return v >= version
	})
	return s.fsm.versionedSettings()
}

// writeSettings commits set under pre through raft, then waits (bounded)
// until this node shows it.
func (s *Store) writeSettings(ctx context.Context, set Settings, pre Precondition) error {
	cmd, err := encodeCommand(pre.command(set))
	if err != nil {
		return err
	}
	var applied func() bool
	var landed func(context.Context) bool
	if pre.kind != anyVersion {
		// A conditional change whose first try got no clear answer may
		// have committed; its retry is then refused by its own
		// condition. It did land if this node's state shows set at a
		// version past the expected one (for AtSettings: shows set).
		// A concurrent admin who wrote the very same settings reads the
		// same way, which leaves the cluster as asked.
		applied = func() bool {
			cur, v := s.fsm.versionedSettings()
			return cur == set && (pre.kind != atVersion || v > pre.version)
		}
		landed = func(ctx context.Context) bool {
			// The leader that refused the retry has applied the first
			// try if it committed; wait, bounded, for this node to.
			wctx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
			defer cancel()
			return s.waitFor(wctx, applied)
		}
	}
	if err := s.writeUntil(ctx, cmd, applied, landed); err != nil {
		return err
	}
	// Best effort read-your-write: a concurrent write may win, in
	// which case these settings never show up here and the wait ends
	// with ctx, which is not an error of this write.
	wctx, cancel := context.WithTimeout(ctx, s.cfg.HeartbeatTimeout)
	defer cancel()
	s.waitFor(wctx, func() bool { return s.fsm.currentSettings() == set })
	return nil
}
