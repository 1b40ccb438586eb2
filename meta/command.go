package meta

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Sentinel errors callers branch on. Errors from a forwarded write are
// whatever the Forwarder returns; node maps gRPC status codes back to these.
var (
	// ErrInvalidCommand is returned for a command the FSM refuses: a
	// malformed encoding, an invalid model spec, invalid settings or members.
	ErrInvalidCommand = errors.New("meta: invalid command")
	// ErrStaleEpoch is returned for a ring change computed against an
	// epoch that is no longer current.
	ErrStaleEpoch = errors.New("meta: stale ring epoch")
	// ErrNotLeader is returned by ApplyForwarded on a node that is not
	// the leader, and by writes on a follower that has no Forwarder.
	ErrNotLeader = errors.New("meta: not the raft leader")
	// ErrNoLeader is returned when no leader became known before the
	// context ended.
	ErrNoLeader = errors.New("meta: no raft leader")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("meta: store closed")
	// ErrLastVoter is returned by Leave when the node is the last raft
	// voter: nobody would be left to run the cluster. It is wrapped with
	// ErrInvalidCommand, so that a forwarded leave is not retried.
	ErrLastVoter = errors.New("meta: the last raft voter cannot leave")
	// ErrSettingsVersion is returned by SetSettings when its
	// Precondition no longer holds: someone else changed the settings
	// meanwhile, and nothing was changed.
	ErrSettingsVersion = errors.New("meta: settings changed since the expected version")
)

// Command encoding: one version byte, one kind byte, then the kind's payload
// as JSON. JSON keeps the log readable with raft-wal's tools and lets fields
// be added without a new version; the log only ever carries small records.
// testdata/commands.golden holds each kind as the code that wrote existing
// logs encoded it, and a test keeps this encoding to it.
const cmdVersion byte = 1

// cmdKind is the kind byte of a command; commandKinds ties each to its type.
type cmdKind byte

const (
	kindRegisterModel cmdKind = 1
	kindSetSettings   cmdKind = 2
	kindRingChange    cmdKind = 3
	kindPutToken      cmdKind = 4
	kindDeleteToken   cmdKind = 5
	kindLeave         cmdKind = 6
)

// command is one raft log entry. Each kind is its own type (registerModel,
// setSettings, ringChange, putToken, deleteToken, leave), whose JSON is the
// kind's payload and which checks and applies itself.
type command interface {
	// kind is the kind byte the command is encoded with.
	kind() cmdKind
	// validate reports why the command cannot be applied to any state, as
	// ErrInvalidCommand. decodeCommand calls it on everything it decodes:
	// a command may come from another node's request.
	validate() error
	// apply returns the state after the command, the log entry at index,
	// applied to cur: cur itself when nothing changes, else a new state
	// (cur is immutable, so a change copies what it changes). An error
	// refuses the command; the state stays cur.
	apply(cur *fsmState, index uint64) (*fsmState, error)
}

// commandKinds is the one table from a kind byte to its type: its name
// (in errors) and how its payload decodes.
var commandKinds = map[cmdKind]struct {
	name   string
	decode func(payload []byte) (command, error)
}{
	kindRegisterModel: {"register-model", decodePayload[registerModel]},
	kindSetSettings:   {"set-settings", decodePayload[setSettings]},
	kindRingChange:    {"ring-change", decodePayload[ringChange]},
	kindPutToken:      {"put-token", decodePayload[putToken]},
	kindDeleteToken:   {"delete-token", decodePayload[deleteToken]},
	kindLeave:         {"leave", decodePayload[leave]},
}

func decodePayload[C command](payload []byte) (command, error) {
	var c C
	if err := json.Unmarshal(payload, &c); err != nil {
		return nil, err
	}
	return c, nil
}

func (k cmdKind) String() string {
	if t, ok := commandKinds[k]; ok {
		return t.name
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// maxCommandBytes bounds a command: a ring change of a few thousand members
// is far below it, and nothing bigger belongs in the log.
const maxCommandBytes = 4 << 20

// encodeCommand encodes c for the log. It does not validate c: the FSM
// refuses an invalid command when it applies it.
func encodeCommand(c command) ([]byte, error) {
	kind := c.kind()
	b := []byte{cmdVersion, byte(kind)}
	body, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("%w: encode %v: %w", ErrInvalidCommand, kind, err)
	}
	b = append(b, body...)
	if len(b) > maxCommandBytes {
		return nil, fmt.Errorf("%w: %v command of %d bytes exceeds %d", ErrInvalidCommand, kind, len(b), maxCommandBytes)
	}
	return b, nil
}

// decodeCommand parses and validates a command. Everything that arrives
// here may come from another node's gRPC request, so it checks all of it.
func decodeCommand(b []byte) (command, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: %d bytes", ErrInvalidCommand, len(b))
	}
	if len(b) > maxCommandBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrInvalidCommand, len(b), maxCommandBytes)
	}
	if b[0] != cmdVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrInvalidCommand, b[0], cmdVersion)
	}
	kind := cmdKind(b[1])
	t, ok := commandKinds[kind]
	if !ok {
		return nil, fmt.Errorf("%w: unknown kind %d", ErrInvalidCommand, b[1])
	}
	c, err := t.decode(b[2:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v payload: %w", ErrInvalidCommand, kind, err)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}
