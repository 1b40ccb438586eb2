package meta

import (
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestSingleNodeRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := fastConfig("solo", dir)
	cfg.BootstrapExpect = 1
	s, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	fp, err := s.RegisterModel(ctxT(t), testSpec(1))
	if err != nil {
		t.Fatal(err)
	}
	if fp != testSpec(1).Fingerprint() {
		t.Fatalf("fingerprint %v, want %v", fp, testSpec(1).Fingerprint())
	}
	bad := testSpec(2)
	bad.Layers = 0
	if _, err := s.RegisterModel(ctxT(t), bad); !errors.Is(err, ErrInvalidCommand) || !errors.Is(err, chunk.ErrInvalidSpec) {
		t.Fatalf("invalid spec: err %v", err)
	}
	want := Settings{ReplicationFactor: 2, WriteQuorum: 1, Codec: chunk.CodecRaw}
	if err := s.SetSettings(ctxT(t), want); err != nil {
		t.Fatal(err)
	}
	eventually(t, "self in ring", func() bool { return len(ringIDs(s)) == 1 })
	epoch := s.Ring().Epoch()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "state replayed", func() bool {
		_, ok := s.Model(fp)
		return ok && s.Settings() == want && s.Ring().Epoch() >= epoch
	})
}
