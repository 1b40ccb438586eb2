package gossipkey

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// member starts a memberlist on loopback with kr, fast timings.
func member(t *testing.T, name string, kr *memberlist.Keyring) *memberlist.Memberlist {
	t.Helper()
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.AdvertiseAddr = "127.0.0.1"
	c.Keyring = kr
	// Failure detection is not under test, and converge wants every
	// member alive at once: probes loose enough that a member starved of
	// CPU (-race on 2 busy cores) is not declared dead and left to refute.
	c.ProbeInterval = 500 * time.Millisecond
	c.ProbeTimeout = 300 * time.Millisecond
	c.SuspicionMult = 4
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = 500 * time.Millisecond
	c.TCPTimeout = time.Second
	c.Logger = log.New(io.Discard, "", 0)
	m, err := memberlist.Create(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

func addr(m *memberlist.Memberlist) string {
	n := m.LocalNode()
	return fmt.Sprintf("%s:%d", n.Addr, n.Port)
}

// converge waits until every member sees want alive members.
func converge(t *testing.T, want int, ms ...*memberlist.Memberlist) {
	t.Helper()
	defer func() {
		if t.Failed() {
			for _, m := range ms {
				t.Logf("%s sees %d members", m.LocalNode().Name, m.NumMembers())
			}
		}
	}()
	testutil.WaitForWithin(t, 20*time.Second, fmt.Sprintf("every member to see %d members", want), func() bool {
		for _, m := range ms {
			if m.NumMembers() != want {
				return false
			}
		}
		return true
	})
}

func keyring(t *testing.T, primary []byte, others ...[]byte) *memberlist.Keyring {
	t.Helper()
	kr, err := NewKeyring(primary, others)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func mustKey(t *testing.T) []byte {
	t.Helper()
	k, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRotation rotates the key of a live three-node cluster in the three
// documented steps; the cluster stays whole throughout, a node with only
// the old key cannot join at the end, and one with the new key can.
func TestRotation(t *testing.T) {
	oldKey, newKey := mustKey(t), mustKey(t)
	krs := []*memberlist.Keyring{keyring(t, oldKey), keyring(t, oldKey), keyring(t, oldKey)}
	var ms []*memberlist.Memberlist
	for i, kr := range krs {
		ms = append(ms, member(t, fmt.Sprintf("n%d", i), kr))
	}
	for _, m := range ms[1:] {
		if _, err := m.Join([]string{addr(ms[0])}); err != nil {
			t.Fatal(err)
		}
	}
	converge(t, 3, ms...)

	// Without the key nobody gets in, before or after.
	stranger := member(t, "stranger", keyring(t, mustKey(t)))
	if _, err := stranger.Join([]string{addr(ms[0])}); err == nil {
		t.Fatal("node with an unknown key joined")
	}

	steps := []struct {
		name string
		do   func(Keyring) error
	}{
		{"install", func(kr Keyring) error { return Install(kr, newKey) }},
		{"use", func(kr Keyring) error { return Use(kr, newKey) }},
		{"remove", func(kr Keyring) error { return Remove(kr, oldKey) }},
	}
	for _, st := range steps {
		for _, kr := range krs {
			if err := st.do(kr); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		// Between steps the cluster still talks: a newcomer given the
		// cluster's current keyring file joins through the last node,
		// everyone sees it, and it takes part in the remaining steps.
		kr := keyring(t, krs[0].GetPrimaryKey(), krs[0].GetKeys()...)
		n := member(t, "after-"+st.name, kr)
		if _, err := n.Join([]string{addr(ms[len(ms)-1])}); err != nil {
			t.Fatalf("after %s: join: %v", st.name, err)
		}
		ms, krs = append(ms, n), append(krs, kr)
		converge(t, len(ms), ms...)
	}
	for _, kr := range krs {
		if !bytes.Equal(kr.GetPrimaryKey(), newKey) || len(kr.GetKeys()) != 1 {
			t.Fatal("keyring not rotated")
		}
	}
	late := member(t, "late-old", keyring(t, oldKey))
	if _, err := late.Join([]string{addr(ms[0])}); err == nil {
		t.Fatal("node with the removed key joined")
	}
	if err := Remove(krs[0], newKey); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("removing the primary: %v", err)
	}
	if err := Use(krs[0], oldKey); err == nil {
		t.Fatal("used a key not installed")
	}
}

func TestKeyringFile(t *testing.T) {
	a, b := mustKey(t), mustKey(t)[:16]
	dir := t.TempDir()
	path := filepath.Join(dir, "gossip.keys")
	if err := WriteFile(path, a, b); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, a); err == nil {
		t.Fatal("WriteFile overwrote a keyring")
	}
	kr, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(kr.GetPrimaryKey(), a) || len(kr.GetKeys()) != 2 {
		t.Fatal("loaded keyring differs")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err == nil {
		t.Fatal("world-readable keyring accepted")
	}
}

func TestParseKeyring(t *testing.T) {
	k32 := Encode(bytes.Repeat([]byte{1}, 32))
	k16 := Encode(bytes.Repeat([]byte{2}, 16))
	cases := []struct {
		name string
		in   string
		n    int
	}{
		{"one", k32 + "\n", 1},
		{"comments and blanks", "# keys\n\n  " + k16 + "  # new\n" + k32 + "\n", 2},
		{"no newline at end", k32, 1},
		{"empty", "", 0},
		{"only comments", "# nothing\n", 0},
		{"bad base64", "not a key\n", 0},
		{"wrong size", Encode([]byte("short")) + "\n", 0},
		{"repeated", k32 + "\n" + k32 + "\n", 0},
		{"too many", strings.Repeat("x\n", 0) + manyKeys(MaxKeys+1), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, all, err := ParseKeyring([]byte(tc.in))
			if tc.n == 0 {
				if !errors.Is(err, ErrInvalidKey) {
					t.Fatalf("err %v", err)
				}
				return
			}
			if err != nil || len(all) != tc.n || !bytes.Equal(p, all[0]) {
				t.Fatalf("%d keys, %v", len(all), err)
			}
		})
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		k := make([]byte, 16)
		k[0] = byte(i)
		b.WriteString(Encode(k) + "\n")
	}
	return b.String()
}

// FuzzParseKeyring: no panic, and what parses re-encodes to keys that
// parse the same.
func FuzzParseKeyring(f *testing.F) {
	f.Add([]byte(Encode(bytes.Repeat([]byte{1}, 32)) + "\n# c\n" + Encode(bytes.Repeat([]byte{2}, 24))))
	f.Add([]byte("#\n\n"))
	f.Add([]byte("AAAA\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, all, err := ParseKeyring(data)
		if err != nil {
			return
		}
		var b strings.Builder
		for _, k := range all {
			b.WriteString(Encode(k) + "\n")
		}
		p2, all2, err := ParseKeyring([]byte(b.String()))
		if err != nil || !bytes.Equal(p, p2) || len(all) != len(all2) {
			t.Fatalf("re-encoded keyring differs: %v", err)
		}
	})
}
