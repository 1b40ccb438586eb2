package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
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
	// ErrSettingsVersion is returned by SetSettingsIf when the settings
	// are no longer at the version the caller expected: someone else
	// changed them meanwhile, and nothing was changed.
	ErrSettingsVersion = errors.New("meta: settings changed since the expected version")
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

// Command encoding: one version byte, one kind byte, then the kind's payload
// as JSON. JSON keeps the log readable with raft-wal's tools and lets fields
// be added without a new version; the log only ever carries small records.
const cmdVersion byte = 1

type cmdKind byte

const (
	kindRegisterModel cmdKind = 1
	kindSetSettings   cmdKind = 2
	kindRingChange    cmdKind = 3
	kindPutToken      cmdKind = 4
	kindDeleteToken   cmdKind = 5
	kindLeave         cmdKind = 6
)

func (k cmdKind) String() string {
	switch k {
	case kindRegisterModel:
		return "register-model"
	case kindSetSettings:
		return "set-settings"
	case kindRingChange:
		return "ring-change"
	case kindPutToken:
		return "put-token"
	case kindDeleteToken:
		return "delete-token"
	case kindLeave:
		return "leave"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// maxCommandBytes bounds a command: a ring change of a few thousand members
// is far below it, and nothing bigger belongs in the log.
const maxCommandBytes = 4 << 20

// ringChange moves the ring from Epoch to Epoch+1: members in Upsert are
// added or replaced (same ID), IDs in Remove leave. The epoch makes the
// change conditional, so a change computed by a deposed leader against an
// older ring fails with ErrStaleEpoch instead of undoing a newer one.
type ringChange struct {
	Epoch  uint64        `json:"epoch"`
	Upsert []ring.Member `json:"upsert,omitempty"`
	Remove []string      `json:"remove,omitempty"`
	// At is the leader's clock when it proposed the change (Unix
	// nanoseconds); the FSM expires tombstones by it (DepartedTTL). Zero
	// in changes written before it existed: no expiry.
	At int64 `json:"at,omitempty"`
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

type registerModel struct {
	Spec chunk.ModelSpec `json:"spec"`
}

// putToken adds an API token record, or replaces the record with its ID.
// The record holds the salted hash of the secret, never the secret.
type putToken struct {
	Record auth.Record `json:"record"`
}

// deleteToken removes the record with ID; an absent ID is a no-op, so a
// retried delete succeeds.
type deleteToken struct {
	ID string `json:"id"`
}

// leave is a node's explicit departure: the node leaves the ring (a new
// epoch when it was a member) and is tombstoned with its incarnation, so
// that the leader does not add it back while gossip still shows that run
// of it alive (it serves reads until it stops, and gossip may never tell
// the leader that it left). It comes back only with another incarnation
// (a new process). The leader also removes it from raft before it
// acknowledges the command (Store.Leave).
//
// At is the proposer's clock (Unix nanoseconds): the tombstone expires
// DepartedTTL after it, unless a later leave of the same incarnation (the
// leader's refresh) moves it on. Zero in leaves written before it existed.
type leave struct {
	ID          string `json:"id"`
	Incarnation uint64 `json:"incarnation"`
	At          int64  `json:"at,omitempty"`
}

// command is a decoded log entry; exactly one payload field is set.
type command struct {
	kind     cmdKind
	model    *registerModel
	settings *setSettings
	ring     *ringChange
	putTok   *putToken
	delTok   *deleteToken
	leave    *leave
}

func encodeCommand(kind cmdKind, payload any) ([]byte, error) {
	b := []byte{cmdVersion, byte(kind)}
	body, err := json.Marshal(payload)
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
		return command{}, fmt.Errorf("%w: %d bytes", ErrInvalidCommand, len(b))
	}
	if len(b) > maxCommandBytes {
		return command{}, fmt.Errorf("%w: %d bytes exceeds %d", ErrInvalidCommand, len(b), maxCommandBytes)
	}
	if b[0] != cmdVersion {
		return command{}, fmt.Errorf("%w: version %d, want %d", ErrInvalidCommand, b[0], cmdVersion)
	}
	c := command{kind: cmdKind(b[1])}
	var target any
	switch c.kind {
	case kindRegisterModel:
		c.model = new(registerModel)
		target = c.model
	case kindSetSettings:
		c.settings = new(setSettings)
		target = c.settings
	case kindRingChange:
		c.ring = new(ringChange)
		target = c.ring
	case kindPutToken:
		c.putTok = new(putToken)
		target = c.putTok
	case kindDeleteToken:
		c.delTok = new(deleteToken)
		target = c.delTok
	case kindLeave:
		c.leave = new(leave)
		target = c.leave
	default:
		return command{}, fmt.Errorf("%w: unknown kind %d", ErrInvalidCommand, b[1])
	}
	if err := json.Unmarshal(b[2:], target); err != nil {
		return command{}, fmt.Errorf("%w: %v payload: %w", ErrInvalidCommand, c.kind, err)
	}
	var err error
	switch c.kind {
	case kindRegisterModel:
		err = validateSpec(c.model.Spec)
	case kindSetSettings:
		err = c.settings.Validate()
	case kindRingChange:
		err = c.ring.validate()
	case kindPutToken:
		err = validateToken(&c.putTok.Record)
	case kindDeleteToken:
		err = validateTokenID(c.delTok.ID)
	case kindLeave:
		err = validateMemberID(c.leave.ID)
		if err == nil && c.leave.At < 0 {
			err = fmt.Errorf("%w: leave at %d", ErrInvalidCommand, c.leave.At)
		}
	}
	if err != nil {
		return command{}, err
	}
	return c, nil
}

// maxMembers bounds one ring; more is a bug, not a cluster.
const maxMembers = 4096

func validateMemberID(id string) error {
	if id == "" || len(id) > 256 {
		return fmt.Errorf("%w: member id %q", ErrInvalidCommand, id)
	}
	return nil
}

func validateMember(m ring.Member) error {
	if err := validateMemberID(m.ID); err != nil {
		return err
	}
	switch {
	case math.IsNaN(m.Weight) || math.IsInf(m.Weight, 0) || m.Weight < 0:
		return fmt.Errorf("%w: member %q weight %v", ErrInvalidCommand, m.ID, m.Weight)
	}
	return nil
}

func (rc *ringChange) validate() error {
	if rc.At < 0 {
		return fmt.Errorf("%w: ring change at %d", ErrInvalidCommand, rc.At)
	}
	if len(rc.Upsert)+len(rc.Remove) == 0 {
		return fmt.Errorf("%w: empty ring change", ErrInvalidCommand)
	}
	if len(rc.Upsert) > maxMembers || len(rc.Remove) > maxMembers {
		return fmt.Errorf("%w: ring change of %d+%d members", ErrInvalidCommand, len(rc.Upsert), len(rc.Remove))
	}
	seen := make(map[string]bool, len(rc.Upsert)+len(rc.Remove))
	for _, m := range rc.Upsert {
		if err := validateMember(m); err != nil {
			return err
		}
		if seen[m.ID] {
			return fmt.Errorf("%w: member %q twice in one change", ErrInvalidCommand, m.ID)
		}
		seen[m.ID] = true
	}
	for _, id := range rc.Remove {
		if id == "" || seen[id] {
			return fmt.Errorf("%w: removed member %q empty or repeated", ErrInvalidCommand, id)
		}
		seen[id] = true
	}
	return nil
}

// maxSpecString bounds each string of a registered spec: names and
// revisions are short, and the bound keeps snapshots bounded.
const maxSpecString = 256

// validateSpec is chunk's validation plus the registry's size bounds.
func validateSpec(spec chunk.ModelSpec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCommand, err)
	}
	for _, v := range []string{spec.Family, spec.Scaling.Type, spec.WeightsRevision, spec.TokenizerID, spec.Salt} {
		if len(v) > maxSpecString {
			return fmt.Errorf("%w: %w: a string of %d bytes exceeds %d", ErrInvalidCommand, chunk.ErrInvalidSpec, len(v), maxSpecString)
		}
	}
	return nil
}

// validateToken is auth's record validation, as ErrInvalidCommand.
func validateToken(r *auth.Record) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCommand, err)
	}
	return nil
}

// validateTokenID checks id has the shape of a token ID (auth.IDBytes
// bytes in lowercase hex), so that a delete cannot carry arbitrary bytes
// into the log.
func validateTokenID(id string) error {
	ok := len(id) == 2*auth.IDBytes
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= '0' && c <= '9' || c >= 'a' && c <= 'f'
	}
	if !ok {
		// Not quoted: a malformed ID may be megabytes of anything.
		return fmt.Errorf("%w: %w: token ID of %d bytes is not %d lowercase hex digits", ErrInvalidCommand, auth.ErrInvalidToken, len(id), 2*auth.IDBytes)
	}
	return nil
}

// LeaveOf returns the node a raft command removes from the cluster: the ID
// of a well-formed leave command, and ok false for any other command or
// bytes that do not decode (ApplyForwarded refuses those). The node's
// handler of forwarded commands uses it to check that a leave comes from
// the node that leaves.
func LeaveOf(cmd []byte) (id string, ok bool) {
	c, err := decodeCommand(cmd)
	if err != nil || c.kind != kindLeave {
		return "", false
	}
	return c.leave.ID, true
}
