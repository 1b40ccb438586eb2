package meta

import "fmt"

// setSettings replaces the settings. Its JSON is Settings' own fields (all
// the command held before conditional changes existed) and the write's
// Precondition: if_version for AtVersion (the FSM refuses the command with
// ErrSettingsVersion unless the settings are still at that version, the
// log index of their last change), if_settings for AtSettings (refused
// the same way unless the settings are still those); neither for
// AnyVersion.
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
