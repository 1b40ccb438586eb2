package gossip

import (
	"errors"
	"slices"

	"github.com/kvmesh/kvmesh/gossip/gossipkey"
)

// ErrNotEncrypted is returned by the key rotation methods of a Gossip
// started without SecretKey or Keyring: encryption cannot be turned on in
// a running cluster.
var ErrNotEncrypted = errors.New("gossip: gossip is not encrypted")

// Key rotation on a running node. Each is one step of gossipkey's
// three-step rotation and must be finished on every node before the next
// step starts anywhere (see package gossipkey); the node's keyring file
// should be rewritten to match after each, so that a restart comes back
// speaking what the cluster speaks. They take effect on the next message
// sent or received and are safe to call concurrently with gossip.

// InstallKey is step 1: key (16, 24 or 32 bytes) decrypts from now on.
// Installing a key already present is a no-op.
func (g *Gossip) InstallKey(key []byte) error {
	if err := g.rotatable(); err != nil {
		return err
	}
	// The keyring keeps the slice it is given.
	return gossipkey.Install(g.keyring, slices.Clone(key))
}

// UseKey is step 2: key, already installed, encrypts from now on.
func (g *Gossip) UseKey(key []byte) error {
	if err := g.rotatable(); err != nil {
		return err
	}
	return gossipkey.Use(g.keyring, key)
}

// RemoveKey is step 3: key no longer decrypts. The primary key cannot be
// removed (an error wrapping gossipkey.ErrInvalidKey); UseKey the new one
// first.
func (g *Gossip) RemoveKey(key []byte) error {
	if err := g.rotatable(); err != nil {
		return err
	}
	return gossipkey.Remove(g.keyring, key)
}

// Keys returns the keyring's primary key and all its keys (primary
// included), copies, for writing the keyring file after a rotation step;
// nil and nil when gossip is not encrypted.
func (g *Gossip) Keys() (primary []byte, all [][]byte) {
	if g.keyring == nil {
		return nil, nil
	}
	// memberlist's getters return its own slices, which a later
	// RemoveKey may shift in place.
	all = g.keyring.GetKeys()
	out := make([][]byte, len(all))
	for i, k := range all {
		out[i] = slices.Clone(k)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out[0], out
}

func (g *Gossip) rotatable() error {
	if g.isClosed() {
		return ErrShutdown
	}
	if g.keyring == nil {
		return ErrNotEncrypted
	}
	return nil
}
