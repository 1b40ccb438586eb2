package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvmesh/kvmesh/auth"
)

// newRecord makes a token and its record, as the admin API will.
func newRecord(t testing.TB, name string, scopes auth.Scope, ns ...string) (auth.Token, auth.Record) {
	t.Helper()
	tok, rec, err := auth.NewToken(name, scopes, ns, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return tok, rec
}

// tokenIDs is the sorted IDs of f's token records.
func tokenIDs(recs []auth.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

// TestFSMTokens drives token puts and deletes, valid and not, through the
// FSM and checks the records after each.
func TestFSMTokens(t *testing.T) {
	_, a := newRecord(t, "a", auth.ScopeRead)
	_, b := newRecord(t, "b", auth.ScopeRead|auth.ScopeWrite, "a1b2")
	a2 := a
	a2.Scopes = auth.ScopeRead | auth.ScopeAdmin
	a2.Name = "a, promoted"
	noScope := b
	noScope.Scopes = 0
	shortSalt := b
	shortSalt.Salt = shortSalt.Salt[:8]
	badNS := b
	badNS.Namespace = auth.Namespace{"XYZ"}
	longName := b
	longName.Name = strings.Repeat("n", auth.MaxName+1)
	f := newFSM(nil)
	steps := []struct {
		name    string
		cmd     []byte
		err     error
		changed bool
		want    []auth.Record
	}{
		{"put a", mustEncode(t, putToken{a}), nil, true, []auth.Record{a}},
		{"put a again", mustEncode(t, putToken{a}), nil, false, []auth.Record{a}},
		{"put b", mustEncode(t, putToken{b}), nil, true, sortRecs(a, b)},
		{"replace a", mustEncode(t, putToken{a2}), nil, true, sortRecs(a2, b)},
		{"no scope", mustEncode(t, putToken{noScope}), auth.ErrInvalidToken, false, sortRecs(a2, b)},
		{"short salt", mustEncode(t, putToken{shortSalt}), auth.ErrInvalidToken, false, sortRecs(a2, b)},
		{"bad namespace", mustEncode(t, putToken{badNS}), auth.ErrInvalidToken, false, sortRecs(a2, b)},
		{"long name", mustEncode(t, putToken{longName}), auth.ErrInvalidToken, false, sortRecs(a2, b)},
		{"empty record", mustEncode(t, putToken{}), ErrInvalidCommand, false, sortRecs(a2, b)},
		{"delete a", mustEncode(t, deleteToken{a.ID}), nil, true, []auth.Record{b}},
		{"delete a again", mustEncode(t, deleteToken{a.ID}), nil, false, []auth.Record{b}},
		{"delete bad id", mustEncode(t, deleteToken{"B0B0B0B0B0B0B0B0"}), auth.ErrInvalidToken, false, []auth.Record{b}},
		{"delete empty id", mustEncode(t, deleteToken{}), ErrInvalidCommand, false, []auth.Record{b}},
		{"delete b", mustEncode(t, deleteToken{b.ID}), nil, true, nil},
	}
	for _, st := range steps {
		changes := 0
		f.onChange = func() { changes++ }
		res := f.Apply(&raft.Log{Type: raft.LogCommand, Data: st.cmd})
		err, _ := res.(error)
		if st.err == nil && err != nil || st.err != nil && (!errors.Is(err, st.err) || !errors.Is(err, ErrInvalidCommand)) {
			t.Fatalf("%s: Apply = %v, want %v", st.name, res, st.err)
		}
		if (changes == 1) != st.changed {
			t.Fatalf("%s: %d change notifications", st.name, changes)
		}
		got := f.tokenList()
		if len(got) != len(st.want) {
			t.Fatalf("%s: tokens %v, want %v", st.name, tokenIDs(got), tokenIDs(st.want))
		}
		for i := range got {
			if !recordsEqual(got[i], st.want[i]) {
				t.Fatalf("%s: token %d = %+v, want %+v", st.name, i, got[i], st.want[i])
			}
		}
		if _, _, n := f.counts(); n != len(st.want) {
			t.Fatalf("%s: counts says %d tokens", st.name, n)
		}
	}
}

func sortRecs(rs ...auth.Record) []auth.Record {
	m := make(map[string]auth.Record)
	for _, r := range rs {
		m[r.ID] = r
	}
	return sortedTokens(m)
}

func TestFSMTokensFull(t *testing.T) {
	f := newFSM(nil)
	st := *f.cur.Load()
	st.tokens = make(map[string]auth.Record, MaxTokens)
	for i := range MaxTokens {
		st.tokens[fmt.Sprintf("%016x", i)] = auth.Record{}
	}
	f.cur.Store(&st)
	_, rec := newRecord(t, "one too many", auth.ScopeRead)
	res := f.Apply(&raft.Log{Type: raft.LogCommand, Data: mustEncode(t, putToken{rec})})
	if err, _ := res.(error); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("put into a full table: %v", res)
	}
	// Replacing a record that exists is still allowed.
	rec.ID = fmt.Sprintf("%016x", 7)
	if res := f.Apply(&raft.Log{Type: raft.LogCommand, Data: mustEncode(t, putToken{rec})}); res != nil {
		t.Fatalf("replace in a full table: %v", res)
	}
}

// TestTokenSnapshot: records survive a snapshot round trip, the snapshot
// holds no secret, and snapshots with bad records are refused.
func TestTokenSnapshot(t *testing.T) {
	tok, rec := newRecord(t, "ops", auth.ScopeRead|auth.ScopeWrite|auth.ScopeAdmin, "ff")
	_, rec2 := newRecord(t, "reader", auth.ScopeRead)
	f := newFSM(nil)
	for _, r := range []auth.Record{rec, rec2} {
		if res := f.Apply(&raft.Log{Type: raft.LogCommand, Data: mustEncode(t, putToken{r})}); res != nil {
			t.Fatal(res)
		}
	}
	b := snapshotBytes(t, f)
	secret := strings.SplitN(tok.String(), ".", 2)[1]
	if bytes.Contains(b, []byte(secret)) {
		t.Fatal("snapshot holds the token secret")
	}
	g := restoreFSM(t, b, nil)
	if !reflect.DeepEqual(tokenIDs(f.tokenList()), tokenIDs(g.tokenList())) {
		t.Fatalf("restored %v, want %v", tokenIDs(g.tokenList()), tokenIDs(f.tokenList()))
	}
	got, ok := g.token(rec.ID)
	if !ok || !recordsEqual(got, rec) || !got.Matches(tok) {
		t.Fatalf("restored record %+v does not verify the token", got)
	}

	base := `{"version":1,"settings":{"replication_factor":1,"write_quorum":1,"codec":1},"tokens":`
	good := mustJSON(t, rec)
	bad := rec
	bad.Hash = bad.Hash[:4]
	for name, tokens := range map[string]string{
		"bad record": "[" + mustJSON(t, bad) + "]",
		"twice":      "[" + good + "," + good + "]",
		"not a list": `{"a":1}`,
	} {
		if err := g.Restore(io.NopCloser(strings.NewReader(base + tokens + "}"))); err == nil {
			t.Fatalf("%s: restore accepted", name)
		}
	}
	if len(g.tokenList()) != 2 {
		t.Fatal("a refused restore changed the tokens")
	}
}

// TestStoreTokens: the Store API on one node, and *Store as the token
// table of an auth.Verifier.
func TestStoreTokens(t *testing.T) {
	cfg := fastConfig("solo", t.TempDir())
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	tok, rec := newRecord(t, "frontend", auth.ScopeRead|auth.ScopeWrite)
	if _, err := s.LookupToken(ctxT(t), rec.ID); !errors.Is(err, auth.ErrUnknownToken) {
		t.Fatalf("lookup before put: %v", err)
	}
	if err := s.PutToken(ctxT(t), rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.LookupToken(ctxT(t), rec.ID)
	if err != nil || !recordsEqual(got, rec) {
		t.Fatalf("lookup = %+v, %v", got, err)
	}
	got.Hash[0] ^= 1 // a copy: the stored record is unchanged
	v := auth.NewVerifier(s)
	p, err := v.Verify(t.Context(), tok.String())
	if err != nil || p.TokenID != rec.ID || p.Scopes != rec.Scopes {
		t.Fatalf("verify = %+v, %v", p, err)
	}
	if st := s.Stats(); st.Tokens != 1 {
		t.Fatalf("stats tokens %d", st.Tokens)
	}
	bad := rec
	bad.Scopes = 0
	if err := s.PutToken(ctxT(t), bad); !errors.Is(err, ErrInvalidCommand) || !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("invalid record: %v", err)
	}
	if err := s.DeleteToken(ctxT(t), "not-an-id"); !errors.Is(err, ErrInvalidCommand) {
		t.Fatalf("bad id: %v", err)
	}
	if err := s.DeleteToken(ctxT(t), rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteToken(ctxT(t), rec.ID); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := v.Verify(t.Context(), tok.String()); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("deleted token verified: %v", err)
	}
	if len(s.Tokens()) != 0 {
		t.Fatal("token listed after delete")
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
