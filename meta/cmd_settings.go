package meta

import (
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

// DefaultSettings returns R=3, W=2, raw codec.
func DefaultSettings() Settings {
	return Settings{ReplicationFactor: DefaultReplicationFactor, WriteQuorum: DefaultWriteQuorum, Codec: chunk.CodecRaw}
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

// setSettings replaces the settings. Its JSON is Settings' own fields (all
// the command held before conditional changes existed) and, for a
// conditional change (SetSettingsIf), if_version: the FSM refuses the
// command with ErrSettingsVersion unless the settings are still at that
// version (the log index of their last change); for a change merged
// from settings read earlier (SetSettingsFrom), if_settings: refused the
// same way unless the settings are still those.
type setSettings struct {
	Settings
	IfVersion  *uint64   `json:"if_version,omitempty"`
	IfSettings *Settings `json:"if_settings,omitempty"`
}

func (setSettings) kind() cmdKind { return kindSetSettings }

// validate checks the settings to set; a condition's settings need not be
// valid (they only ever compare).
func (c setSettings) validate() error { return c.Settings.Validate() }

// apply sets the settings at version index, if its conditions hold; the
// same settings again change nothing, not even the version.
func (c setSettings) apply(cur *fsmState, index uint64) (*fsmState, error) {
	if c.IfVersion != nil && *c.IfVersion != cur.settingsVersion {
		return cur, fmt.Errorf("%w: settings are at version %d, not %d", ErrSettingsVersion, cur.settingsVersion, *c.IfVersion)
	}
	if c.IfSettings != nil && *c.IfSettings != cur.settings {
		return cur, fmt.Errorf("%w: settings changed since they were read", ErrSettingsVersion)
	}
	if cur.settings == c.Settings {
		return cur, nil
	}
	next := *cur
	next.settings = c.Settings
	next.settingsVersion = index
	return &next, nil
}
