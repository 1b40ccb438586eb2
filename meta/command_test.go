package meta

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/ring"
)

// goldenRecord is the token record of testdata/commands.golden.
func goldenRecord() auth.Record {
	return auth.Record{ID: "0123456789abcdef", Salt: bytes.Repeat([]byte{0xa5}, 16), Hash: bytes.Repeat([]byte{0x5a}, 32),
		Scopes: auth.ScopeRead | auth.ScopeWrite, Namespace: auth.Namespace{"a1", "ff00"}, Name: "rag-frontend",
		Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Expires: time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// goldenCommands are the commands of testdata/commands.golden, by name.
func goldenCommands() map[string]command {
	v := uint64(12)
	from := Settings{ReplicationFactor: 3, WriteQuorum: 2, Codec: chunk.CodecRaw}
	spec := testSpec(3)
	spec.Scaling = chunk.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositions: 32768, BetaFast: 32, BetaSlow: 1, AttentionFactor: 0.75}
	spec.RotaryDim = 64
	spec.Salt = "tenant\x00é"
	rec := goldenRecord()
	bare := rec
	bare.Namespace, bare.Name, bare.Expires = nil, "", time.Time{}
	return map[string]command{
		"register-model":            registerModel{Spec: testSpec(1)},
		"register-model-yarn-salt":  registerModel{Spec: spec},
		"set-settings-bare":         setSettings{Settings: Settings{ReplicationFactor: 5, WriteQuorum: 3, Codec: chunk.CodecInt8}},
		"set-settings-if-version":   setSettings{Settings: Settings{2, 1, chunk.CodecLossless}, IfVersion: &v},
		"set-settings-if-version-0": setSettings{Settings: Settings{2, 1, chunk.CodecLossless}, IfVersion: new(uint64)},
		"set-settings-if-settings":  setSettings{Settings: Settings{1, 1, chunk.CodecFP8}, IfSettings: &from},
		"ring-change": ringChange{Epoch: 7, Upsert: []ring.Member{member("a"), {ID: "b", GRPCAddr: "g", RaftAddr: "r", Weight: 0.5}},
			Remove: []string{"c"}, At: 1 << 60},
		"ring-change-remove-only": ringChange{Epoch: 0, Remove: []string{"x"}},
		"put-token":               putToken{Record: rec},
		"put-token-bare":          putToken{Record: bare},
		"delete-token":            deleteToken{ID: rec.ID},
		"leave":                   leave{ID: "n3", Incarnation: 1 << 62, At: 1 << 60},
		"leave-without-time":      leave{ID: "n3", Incarnation: 7},
	}
}

// TestCommandGolden: the commands in existing raft logs (testdata/
// commands.golden, written by the encoder before commands became types)
// decode to the commands they were, and each command encodes to exactly
// those bytes again. Every kind is in the file.
func TestCommandGolden(t *testing.T) {
	want := goldenCommands()
	f, err := os.Open("testdata/commands.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kinds := make(map[cmdKind]bool)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "\t")
		head, payload, _ := strings.Cut(rest, "\t")
		var version, kind byte
		if _, err := fmt.Sscanf(head, "%d %d", &version, &kind); err != nil {
			t.Fatalf("%s: %q: %v", name, head, err)
		}
		b := append([]byte{version, kind}, payload...)
		c, ok := want[name]
		if !ok {
			t.Fatalf("golden command %q has no expected value", name)
		}
		delete(want, name)
		got, err := decodeCommand(b)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("%s: decoded %+v, %v; want %+v", name, got, err, c)
		}
		enc, err := encodeCommand(c)
		if err != nil || !bytes.Equal(enc, b) {
			t.Errorf("%s: encodes to %q, %v; the log holds %q", name, enc, err, b)
		}
		kinds[c.kind()] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for name := range want {
		t.Errorf("%s is not in testdata/commands.golden", name)
	}
	for k := range commandKinds {
		if !kinds[k] {
			t.Errorf("no golden command of kind %v", k)
		}
	}
}

// TestCommandKinds: each kind's type says its own kind, so a command
// encodes with the kind byte it decodes from.
func TestCommandKinds(t *testing.T) {
	for k, typ := range commandKinds {
		c, err := typ.decode([]byte("{}"))
		if err != nil || c.kind() != k {
			t.Errorf("kind %v decodes to %T of kind %v (%v)", k, c, c.kind(), err)
		}
	}
	if _, err := decodeCommand([]byte{cmdVersion, 99, '{', '}'}); !errors.Is(err, ErrInvalidCommand) {
		t.Errorf("unknown kind: %v", err)
	}
}

// cmdCase is one command applied to one state: validate refuses it
// (invalid), apply refuses it (err), it changes nothing (after nil: apply
// returns the very state it was given), or it leads to after.
type cmdCase struct {
	name    string
	before  snapshotState
	tweak   func(*fsmState) // if set, adjusts the state built from before
	cmd     command
	invalid bool
	err     error
	after   *snapshotState
}

// cmdIndex is the log index the cases apply their command at.
const cmdIndex = 100

// state is a snapshot with the default settings unless it says others.
func state(s snapshotState) snapshotState {
	if s.Settings == (Settings{}) {
		s.Settings = DefaultSettings()
	}
	s.Version = snapshotVersion
	return s
}

// normal makes empty slices nil, so snapshots compare by content.
func normal(s snapshotState) snapshotState {
	if len(s.Models) == 0 {
		s.Models = nil
	}
	if len(s.Members) == 0 {
		s.Members = nil
	}
	if len(s.Tokens) == 0 {
		s.Tokens = nil
	}
	if len(s.Left) == 0 {
		s.Left = nil
	}
	return s
}

func runCmdCases(t *testing.T, cases []cmdCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cmd.validate()
			if tc.invalid {
				if !errors.Is(err, ErrInvalidCommand) || tc.err != nil && !errors.Is(err, tc.err) {
					t.Fatalf("validate = %v, want %v (and ErrInvalidCommand)", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate = %v", err)
			}
			cur := newState(state(tc.before))
			if tc.tweak != nil {
				tc.tweak(cur)
			}
			was := normal(cur.snapshot())
			next, err := tc.cmd.apply(cur, cmdIndex)
			if tc.err != nil || err != nil {
				if tc.err == nil || !errors.Is(err, tc.err) {
					t.Fatalf("apply = %v, want %v", err, tc.err)
				}
			}
			if got := normal(cur.snapshot()); !reflect.DeepEqual(got, was) {
				t.Fatalf("apply modified the state it was given:\n%+v\nwas\n%+v", got, was)
			}
			if tc.err != nil || tc.after == nil {
				if next != cur {
					t.Fatalf("apply returned a new state %+v, want none", next.snapshot())
				}
				return
			}
			if next == cur {
				t.Fatal("apply changed nothing")
			}
			if got, want := normal(next.snapshot()), normal(state(*tc.after)); !reflect.DeepEqual(got, want) {
				t.Fatalf("after apply:\n%+v\nwant\n%+v", got, want)
			}
			if next.ring.Epoch() != next.epoch || len(next.ring.Members()) != len(next.members) {
				t.Fatalf("ring at epoch %d with %d members, state at %d with %d", next.ring.Epoch(), len(next.ring.Members()), next.epoch, len(next.members))
			}
		})
	}
}

func TestCommandRegisterModel(t *testing.T) {
	s1, s2 := testSpec(1), testSpec(2)
	bad := testSpec(1)
	bad.HeadDim = 3
	longSalt := testSpec(1)
	longSalt.Salt = strings.Repeat("s", chunk.MaxSpecString+1)
	runCmdCases(t, []cmdCase{
		{name: "new spec", cmd: registerModel{s1}, after: &snapshotState{Models: []chunk.ModelSpec{s1}}},
		{name: "another spec", before: snapshotState{Models: []chunk.ModelSpec{s1}}, cmd: registerModel{s2},
			after: &snapshotState{Models: sortedSpecs(s1, s2)}},
		{name: "the same spec again", before: snapshotState{Models: []chunk.ModelSpec{s1}}, cmd: registerModel{s1}},
		{name: "invalid spec", cmd: registerModel{bad}, invalid: true, err: chunk.ErrInvalidSpec},
		{name: "empty spec", cmd: registerModel{}, invalid: true, err: chunk.ErrInvalidSpec},
		{name: "salt too long", cmd: registerModel{longSalt}, invalid: true, err: chunk.ErrInvalidSpec},
		{name: "registry full", cmd: registerModel{s2}, err: ErrInvalidCommand, tweak: func(st *fsmState) {
			full := *st.models
			full.n = MaxModels
			st.models = &full
		}},
		{name: "registry full, known spec", before: snapshotState{Models: []chunk.ModelSpec{s1}}, cmd: registerModel{s1}, tweak: func(st *fsmState) {
			full := *st.models
			full.n = MaxModels
			st.models = &full
		}},
	})
}

// sortedSpecs is specs in the registry's order (by fingerprint).
func sortedSpecs(specs ...chunk.ModelSpec) []chunk.ModelSpec {
	st := newState(state(snapshotState{Models: specs}))
	return st.models.sorted()
}

func TestCommandSetSettings(t *testing.T) {
	ver := func(v uint64) *uint64 { return &v }
	def := DefaultSettings()
	s1 := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecLossless}
	s2 := Settings{ReplicationFactor: 5, WriteQuorum: 3, Codec: chunk.CodecInt8}
	at7 := snapshotState{Settings: s1, SettingsVersion: 7}
	runCmdCases(t, []cmdCase{
		{name: "unconditional", cmd: setSettings{Settings: s1}, after: &snapshotState{Settings: s1, SettingsVersion: cmdIndex}},
		{name: "unconditional, the same settings: no new version", before: at7, cmd: setSettings{Settings: s1}},
		{name: "at the version held", before: at7, cmd: setSettings{Settings: s2, IfVersion: ver(7)},
			after: &snapshotState{Settings: s2, SettingsVersion: cmdIndex}},
		{name: "at version 0, the defaults", cmd: setSettings{Settings: s2, IfVersion: ver(0)},
			after: &snapshotState{Settings: s2, SettingsVersion: cmdIndex}},
		{name: "at an older version", before: at7, cmd: setSettings{Settings: s2, IfVersion: ver(3)}, err: ErrSettingsVersion},
		{name: "at a version from the future", before: at7, cmd: setSettings{Settings: s2, IfVersion: ver(99)}, err: ErrSettingsVersion},
		{name: "the same settings at another version", before: at7, cmd: setSettings{Settings: s1, IfVersion: ver(3)}, err: ErrSettingsVersion},
		{name: "from the settings held", before: at7, cmd: setSettings{Settings: s2, IfSettings: &s1},
			after: &snapshotState{Settings: s2, SettingsVersion: cmdIndex}},
		{name: "from other settings", before: at7, cmd: setSettings{Settings: s2, IfSettings: &def}, err: ErrSettingsVersion},
		{name: "both conditions hold", before: at7, cmd: setSettings{Settings: s2, IfVersion: ver(7), IfSettings: &s1},
			after: &snapshotState{Settings: s2, SettingsVersion: cmdIndex}},
		{name: "W > R", cmd: setSettings{Settings: Settings{2, 3, chunk.CodecRaw}}, invalid: true},
		{name: "R = 0", cmd: setSettings{Settings: Settings{0, 0, chunk.CodecRaw}}, invalid: true},
		{name: "R too large", cmd: setSettings{Settings: Settings{MaxReplicationFactor + 1, 1, chunk.CodecRaw}}, invalid: true},
		{name: "unknown codec", cmd: setSettings{Settings: Settings{1, 1, chunk.Codec(77)}}, invalid: true},
		{name: "no settings at all", cmd: setSettings{}, invalid: true},
	})
}

func TestCommandRingChange(t *testing.T) {
	a, b, c := member("a"), member("b"), member("c")
	b2 := b
	b2.GRPCAddr = "moved"
	ab := snapshotState{Epoch: 1, Members: []ring.Member{a, b}}
	ttl := int64(DepartedTTL)
	t0 := int64(1) << 60
	many := make([]ring.Member, maxMembers)
	for i := range many {
		many[i] = member(fmt.Sprintf("m%04d", i))
	}
	runCmdCases(t, []cmdCase{
		{name: "first members", cmd: ringChange{Epoch: 0, Upsert: []ring.Member{b, a}}, after: &ab},
		{name: "add and remove", before: ab, cmd: ringChange{Epoch: 1, Upsert: []ring.Member{c}, Remove: []string{"a"}},
			after: &snapshotState{Epoch: 2, Members: []ring.Member{b, c}}},
		{name: "readdress", before: ab, cmd: ringChange{Epoch: 1, Upsert: []ring.Member{b2}},
			after: &snapshotState{Epoch: 2, Members: []ring.Member{a, b2}}},
		{name: "nothing moves: the epoch stays", before: ab, cmd: ringChange{Epoch: 1, Upsert: []ring.Member{a}, Remove: []string{"zz"}}},
		{name: "stale epoch", before: ab, cmd: ringChange{Epoch: 0, Upsert: []ring.Member{c}}, err: ErrStaleEpoch},
		{name: "back with another incarnation clears the tombstone",
			before: snapshotState{Epoch: 1, Members: []ring.Member{a}, Left: []departure{{"b", 5, t0}}},
			cmd:    ringChange{Epoch: 1, Upsert: []ring.Member{b}, At: t0 + 1},
			after:  &snapshotState{Epoch: 2, Members: []ring.Member{a, b}}},
		{name: "nothing moves but a tombstone expires",
			before: snapshotState{Epoch: 1, Members: []ring.Member{a, b}, Left: []departure{{"x", 1, t0}, {"y", 2, t0 + ttl}}},
			cmd:    ringChange{Epoch: 1, Upsert: []ring.Member{a}, At: t0 + ttl},
			after:  &snapshotState{Epoch: 1, Members: []ring.Member{a, b}, Left: []departure{{"y", 2, t0 + ttl}}}},
		{name: "an unstamped tombstone is stamped",
			before: snapshotState{Epoch: 1, Members: []ring.Member{a}, Left: []departure{{"x", 1, 0}}},
			cmd:    ringChange{Epoch: 1, Upsert: []ring.Member{b}, At: t0},
			after:  &snapshotState{Epoch: 2, Members: []ring.Member{a, b}, Left: []departure{{"x", 1, t0}}}},
		{name: "the ring would be too large", before: snapshotState{Epoch: 1, Members: many}, cmd: ringChange{Epoch: 1, Upsert: []ring.Member{c}},
			err: ErrInvalidCommand},
		{name: "empty", cmd: ringChange{Epoch: 0}, invalid: true},
		{name: "a member twice", cmd: ringChange{Upsert: []ring.Member{a, a}}, invalid: true},
		{name: "added and removed", cmd: ringChange{Upsert: []ring.Member{a}, Remove: []string{"a"}}, invalid: true},
		{name: "removed twice", cmd: ringChange{Remove: []string{"a", "a"}}, invalid: true},
		{name: "empty ID", cmd: ringChange{Upsert: []ring.Member{{}}}, invalid: true},
		{name: "empty removed ID", cmd: ringChange{Remove: []string{""}}, invalid: true},
		{name: "ID too long", cmd: ringChange{Upsert: []ring.Member{{ID: strings.Repeat("x", 257)}}}, invalid: true},
		{name: "negative weight", cmd: ringChange{Upsert: []ring.Member{{ID: "e", Weight: -1}}}, invalid: true},
		{name: "NaN weight", cmd: ringChange{Upsert: []ring.Member{{ID: "e", Weight: math.NaN()}}}, invalid: true},
		{name: "infinite weight", cmd: ringChange{Upsert: []ring.Member{{ID: "e", Weight: math.Inf(1)}}}, invalid: true},
		{name: "negative time", cmd: ringChange{Upsert: []ring.Member{a}, At: -1}, invalid: true},
		{name: "too many members", cmd: ringChange{Upsert: append(many, c)}, invalid: true},
	})
}

func TestCommandLeave(t *testing.T) {
	a, b := member("a"), member("b")
	ab := snapshotState{Epoch: 1, Members: []ring.Member{a, b}}
	t0 := int64(1) << 60
	ttl := int64(DepartedTTL)
	leftB := snapshotState{Epoch: 2, Members: []ring.Member{a}, Left: []departure{{"b", 5, t0}}}
	full := make([]departure, maxMembers)
	for i := range full {
		full[i] = departure{ID: fmt.Sprintf("d%04d", i), Incarnation: 1, At: t0}
	}
	runCmdCases(t, []cmdCase{
		{name: "a member leaves", before: ab, cmd: leave{ID: "b", Incarnation: 5, At: t0}, after: &leftB},
		{name: "retried", before: leftB, cmd: leave{ID: "b", Incarnation: 5, At: t0}},
		{name: "an older refresh", before: leftB, cmd: leave{ID: "b", Incarnation: 5, At: t0 - 1}},
		{name: "the leader's refresh", before: leftB, cmd: leave{ID: "b", Incarnation: 5, At: t0 + ttl/2},
			after: &snapshotState{Epoch: 2, Members: []ring.Member{a}, Left: []departure{{"b", 5, t0 + ttl/2}}}},
		{name: "another incarnation", before: leftB, cmd: leave{ID: "b", Incarnation: 6, At: t0},
			after: &snapshotState{Epoch: 2, Members: []ring.Member{a}, Left: []departure{{"b", 6, t0}}}},
		{name: "a non-member: tombstone only", before: ab, cmd: leave{ID: "x", Incarnation: 1, At: t0},
			after: &snapshotState{Epoch: 1, Members: []ring.Member{a, b}, Left: []departure{{"x", 1, t0}}}},
		{name: "without a time (an old log)", before: ab, cmd: leave{ID: "b", Incarnation: 5},
			after: &snapshotState{Epoch: 2, Members: []ring.Member{a}, Left: []departure{{"b", 5, 0}}}},
		{name: "retried, and another tombstone expires",
			before: snapshotState{Epoch: 2, Members: []ring.Member{a}, Left: []departure{{"b", 5, t0 + ttl}, {"x", 1, t0}}},
			cmd:    leave{ID: "b", Incarnation: 5, At: t0 + ttl},
			after:  &snapshotState{Epoch: 2, Members: []ring.Member{a}, Left: []departure{{"b", 5, t0 + ttl}}}},
		{name: "too many tombstones", before: snapshotState{Left: full}, cmd: leave{ID: "x", Incarnation: 1, At: t0}, err: ErrInvalidCommand},
		{name: "too many tombstones, a known one", before: snapshotState{Left: full}, cmd: leave{ID: "d0001", Incarnation: 2, At: t0},
			after: &snapshotState{Left: append(append(append([]departure(nil), full[:1]...), departure{"d0001", 2, t0}), full[2:]...)}},
		{name: "empty ID", cmd: leave{Incarnation: 1}, invalid: true},
		{name: "ID too long", cmd: leave{ID: strings.Repeat("x", 257)}, invalid: true},
		{name: "negative time", cmd: leave{ID: "a", At: -1}, invalid: true},
	})
}

func TestCommandTokens(t *testing.T) {
	rec := goldenRecord()
	rec2 := rec
	rec2.Name = "renamed"
	other := rec
	other.ID = "fedcba9876543210"
	noScope := rec
	noScope.Scopes = 0
	shortSalt := rec
	shortSalt.Salt = rec.Salt[:3]
	one := snapshotState{Tokens: []auth.Record{rec}}
	runCmdCases(t, []cmdCase{
		{name: "put a new record", cmd: putToken{rec}, after: &one},
		{name: "put the same record", before: one, cmd: putToken{rec}},
		{name: "put a replacement", before: one, cmd: putToken{rec2}, after: &snapshotState{Tokens: []auth.Record{rec2}}},
		{name: "put another", before: one, cmd: putToken{other}, after: &snapshotState{Tokens: []auth.Record{rec, other}}},
		{name: "put with the table full", cmd: putToken{other}, err: ErrInvalidCommand, tweak: fillTokens},
		{name: "put without a scope", cmd: putToken{noScope}, invalid: true, err: auth.ErrInvalidToken},
		{name: "put with a short salt", cmd: putToken{shortSalt}, invalid: true, err: auth.ErrInvalidToken},
		{name: "put an empty record", cmd: putToken{}, invalid: true},
		{name: "delete", before: one, cmd: deleteToken{rec.ID}, after: &snapshotState{}},
		{name: "delete an absent ID", before: one, cmd: deleteToken{other.ID}},
		{name: "delete uppercase", cmd: deleteToken{"0123456789ABCDEF"}, invalid: true, err: auth.ErrInvalidToken},
		{name: "delete a short ID", cmd: deleteToken{"0123"}, invalid: true, err: auth.ErrInvalidToken},
		{name: "delete an empty ID", cmd: deleteToken{}, invalid: true},
	})
}

// fillTokens gives st MaxTokens records (none of them goldenRecord's).
func fillTokens(st *fsmState) {
	st.tokens = make(map[string]auth.Record, MaxTokens)
	for i := range MaxTokens {
		id := fmt.Sprintf("%016x", 1<<40+i)
		st.tokens[id] = auth.Record{ID: id}
	}
}
