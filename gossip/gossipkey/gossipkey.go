// Package gossipkey makes, reads and rotates the AES keys that encrypt
// kvmesh's memberlist gossip.
//
// A keyring file holds one base64 key per line (16, 24 or 32 bytes; '#'
// starts a comment); the first key is the primary, which encrypts, and
// every key decrypts. Rotation is three cluster-wide steps, each finished
// on every node before the next starts, so no node ever receives a
// message it cannot decrypt:
//
//  1. Install: every node adds the new key (Install).
//  2. Use: every node makes it the primary (Use).
//  3. Remove: every node drops the old key (Remove).
//
// A node that has only the old key can no longer join after step 3.
package gossipkey

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/memberlist"
)

// ErrInvalidKey is wrapped by every error about a malformed key or file.
var ErrInvalidKey = errors.New("gossipkey: invalid key")

// KeySize is the size of generated keys (AES-256).
const KeySize = 32

// MaxKeys bounds a keyring file: a rotation needs two keys at once.
const MaxKeys = 16

// Generate returns a new random 32-byte key.
func Generate() ([]byte, error) {
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("gossipkey: random: %w", err)
	}
	return k, nil
}

// Encode writes a key in standard base64, the form files and flags use.
func Encode(key []byte) string { return base64.StdEncoding.EncodeToString(key) }

// Parse reads a base64 key of 16, 24 or 32 bytes.
func Parse(s string) ([]byte, error) {
	k, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("%w: not base64", ErrInvalidKey)
	}
	switch len(k) {
	case 16, 24, 32:
		return k, nil
	}
	return nil, fmt.Errorf("%w: %d bytes, want 16, 24 or 32", ErrInvalidKey, len(k))
}

// ParseKeyring reads keyring file contents: one key per line, the first
// the primary; blank lines and '#' comments are skipped; a key listed twice
// is an error.
func ParseKeyring(data []byte) (primary []byte, all [][]byte, err error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	line := 0
	for sc.Scan() {
		line++
		s := sc.Text()
		if i := strings.IndexByte(s, '#'); i >= 0 {
			s = s[:i]
		}
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		k, err := Parse(s)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: %w", line, err)
		}
		for _, o := range all {
			if bytes.Equal(o, k) {
				return nil, nil, fmt.Errorf("%w: line %d repeats a key", ErrInvalidKey, line)
			}
		}
		if len(all) == MaxKeys {
			return nil, nil, fmt.Errorf("%w: more than %d keys", ErrInvalidKey, MaxKeys)
		}
		all = append(all, k)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if len(all) == 0 {
		return nil, nil, fmt.Errorf("%w: no key", ErrInvalidKey)
	}
	return all[0], all, nil
}

// LoadFile reads a keyring file and returns a memberlist keyring for
// memberlist.Config.Keyring. The file must not be readable by group or
// others (as ssh insists for private keys).
func LoadFile(path string) (*memberlist.Keyring, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("gossipkey: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("gossipkey: %s is readable by others (mode %v); chmod 600 it", path, st.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossipkey: %w", err)
	}
	primary, all, err := ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("gossipkey: %s: %w", path, err)
	}
	return NewKeyring(primary, all)
}

// NewKeyring returns a memberlist keyring with primary as the encrypting
// key and all (which may include primary) as decrypting keys.
func NewKeyring(primary []byte, all [][]byte) (*memberlist.Keyring, error) {
	kr, err := memberlist.NewKeyring(all, primary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	return kr, nil
}

// WriteFile writes a keyring file (mode 0600) with primary first. It
// fails if the file exists.
func WriteFile(path string, primary []byte, others ...[]byte) error {
	var b strings.Builder
	b.WriteString("# kvmesh gossip keyring: the first key encrypts, all decrypt.\n")
	for _, k := range append([][]byte{primary}, others...) {
		if _, err := Parse(Encode(k)); err != nil {
			return err
		}
		b.WriteString(Encode(k))
		b.WriteByte('\n')
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("gossipkey: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		_ = f.Close()
		return fmt.Errorf("gossipkey: write %s: %w", path, err)
	}
	// Synced, so a caller that renames the file into place after a crash
	// finds either the old keyring or this one whole.
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("gossipkey: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("gossipkey: write %s: %w", path, err)
	}
	return nil
}

// Keyring is the part of *memberlist.Keyring a rotation step uses.
type Keyring interface {
	AddKey(key []byte) error
	UseKey(key []byte) error
	RemoveKey(key []byte) error
	GetPrimaryKey() []byte
}

// Install is rotation step 1 on one node: add key as a decrypting key.
// Installing a key already present is a no-op, so a step can be retried.
func Install(kr Keyring, key []byte) error {
	if _, err := Parse(Encode(key)); err != nil {
		return err
	}
	if err := kr.AddKey(key); err != nil {
		return fmt.Errorf("gossipkey: install: %w", err)
	}
	return nil
}

// Use is rotation step 2 on one node: make key, already installed, the
// primary.
func Use(kr Keyring, key []byte) error {
	if err := kr.UseKey(key); err != nil {
		return fmt.Errorf("gossipkey: use: %w", err)
	}
	return nil
}

// Remove is rotation step 3 on one node: drop old. The primary key cannot
// be removed; Use the new one first.
func Remove(kr Keyring, old []byte) error {
	if bytes.Equal(kr.GetPrimaryKey(), old) {
		return fmt.Errorf("%w: cannot remove the primary key; use the new key first", ErrInvalidKey)
	}
	if err := kr.RemoveKey(old); err != nil {
		return fmt.Errorf("gossipkey: remove: %w", err)
	}
	return nil
}
