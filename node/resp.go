package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/respserver"
)

// RESPConfig is the configuration of this node's Redis-protocol door
// (kvmeshd -resp): its Backend, the node's TLS, the entry limits, and the
// node's metrics and refusal counter. Zero fields take
// respserver.DefaultConfig's values.
func (n *Node) RESPConfig() respserver.Config {
	cfg := respserver.Config{
		Backend:      &respBackend{n: n},
		TLS:          n.sec.tls.ServerConfig(),
		MaxBulkBytes: chunk.MaxOpaqueBytes(n.cfg.Limits),
		Metrics:      n.metrics.resp,
		Logger:       n.log,
		Refused: func(command, reason string) {
			n.metrics.refused.WithLabelValues("resp/"+command, reason).Inc()
		},
		Info: func() []string {
			set := n.meta.Settings()
			return []string{"node_id:" + n.cfg.NodeID, fmt.Sprintf("replication_factor:%d", set.ReplicationFactor),
				fmt.Sprintf("write_quorum:%d", set.WriteQuorum)}
		},
	}
	if n.cfg.Tokens {
		cfg.Backend = &respBackend{n: n, verifier: auth.NewVerifier(n.meta)}
	}
	return cfg
}

// respBackend stores the door's values as opaque entries (chunk/opaque.go)
// through the replicator, as a client's Put and Get do: W copies before a
// SET is acknowledged, reads from the replicas, the tiers and codecs of
// every entry.
type respBackend struct {
	n        *Node
	verifier *auth.Verifier // nil: no tokens, one keyspace for all
	models   sync.Map       // chunk.Fingerprint of an opaque model known registered
}

func (b *respBackend) Open(ctx context.Context, token string) (respserver.Keyspace, error) {
	if b.verifier == nil {
		if token != "" {
			return nil, respserver.ErrNoAuth
		}
		return b.keyspace(nil, "", auth.TokenScopes), nil
	}
	if token == "" {
		return nil, respserver.ErrAuthRequired
	}
	p, err := b.verifier.Verify(ctx, token)
	if err != nil {
		return nil, respAuthError(err)
	}
	return b.keyspace(p.Namespace, token, p.Scopes), nil
}

func respAuthError(err error) error {
	if errors.Is(err, auth.ErrUnauthenticated) {
		return fmt.Errorf("%w: %v", respserver.ErrBadToken, err)
	}
	return err
}

// opaqueNamespace is the Salt of the opaque model of a token namespace:
// tokens of one namespace share a keyspace, others never see it.
func opaqueNamespace(ns auth.Namespace) string {
	s := slices.Clone(ns)
	slices.Sort(s)
	salt := "resp:" + strings.Join(slices.Compact(s), ",")
	if len(salt) > chunk.MaxSpecString {
		salt = fmt.Sprintf("resp-xxh64:%016x", xxhash.Sum64String(salt))
	}
	return salt
}

func (b *respBackend) keyspace(ns auth.Namespace, token string, scopes auth.Scope) *respKeyspace {
	spec := chunk.OpaqueSpec(opaqueNamespace(ns))
	return &respKeyspace{b: b, spec: spec, fp: spec.Fingerprint(), token: token, scopes: scopes}
}

// respKeyspace is the keyspace of one token namespace.
type respKeyspace struct {
	b      *respBackend
	spec   chunk.ModelSpec
	fp     chunk.Fingerprint
	token  string // re-verified on every command, so a revoked token stops at once
	scopes auth.Scope
}

// check refuses a command the token may no longer run.
func (k *respKeyspace) check(ctx context.Context, need auth.Scope, what string) error {
	scopes := k.scopes
	if k.b.verifier != nil {
		p, err := k.b.verifier.Verify(ctx, k.token)
		if err != nil {
			return respAuthError(err)
		}
		scopes = p.Scopes
	}
	if !scopes.Has(need) {
		return fmt.Errorf("%w: this token may not %s (it holds %v, %s needs %v)", respserver.ErrNoPerm, what, scopes, what, need)
	}
	return nil
}

// register makes sure the opaque model is in the cluster's metadata, which
// every replica checks an entry against.
func (k *respKeyspace) register(ctx context.Context) error {
	if _, ok := k.b.models.Load(k.fp); ok {
		return nil
	}
	if _, ok := k.b.n.meta.Model(k.fp); !ok {
		if _, err := k.b.n.meta.RegisterModel(ctx, k.spec); err != nil {
			return fmt.Errorf("registering the opaque model %s: %w", k.fp, err)
		}
	}
	k.b.models.Store(k.fp, true)
	return nil
}

// read returns the stored entry of key; release it.
func (k *respKeyspace) read(ctx context.Context, key []byte) (replication.ReadResult, error) {
	if err := k.check(ctx, auth.ScopeRead, "read"); err != nil {
		return replication.ReadResult{}, err
	}
	rr, err := k.b.n.repl.Read(ctx, chunk.OpaqueKey(k.fp, key))
	if errors.Is(err, replication.ErrNotFound) || status.Code(err) == codes.NotFound {
		return rr, fmt.Errorf("%w: %w", respserver.ErrNotFound, err)
	}
	return rr, err
}

func (k *respKeyspace) Get(ctx context.Context, key []byte) ([]byte, error) {
	rr, err := k.read(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rr.Blob.Release()
	return chunk.DecodeOpaque(rr.Blob.Bytes(), key, k.b.n.cfg.Limits)
}

func (k *respKeyspace) Len(ctx context.Context, key []byte) (int, error) {
	rr, err := k.read(ctx, key)
	if err != nil {
		return 0, err
	}
	defer rr.Blob.Release()
	hd, err := chunk.ParseHeader(rr.Blob.Bytes(), k.b.n.cfg.Limits)
	if err != nil {
		return 0, err
	}
	_, n := chunk.OpaqueLens(&hd)
	return n, nil
}

func (k *respKeyspace) Set(ctx context.Context, key, value []byte) error {
	if err := k.check(ctx, auth.ScopeWrite, "write"); err != nil {
		return err
	}
	blob, err := chunk.EncodeOpaque(nil, k.fp, key, value, k.b.n.cfg.Limits)
	if errors.Is(err, chunk.ErrTooLarge) {
		return fmt.Errorf("%w: %w", respserver.ErrTooLarge, err)
	}
	if err != nil {
		return err
	}
	if err := k.register(ctx); err != nil {
		return err
	}
	// The cluster keeps one version of a key (replication.Wins): a SET
	// that finds another value kept replaces it by a delete and a write
	// after it. A write that a concurrent SET's delete refused tries
	// again, a few times.
	deleted := false
	for range setAttempts {
		res, err := k.b.n.repl.WriteOwned(ctx, blob, nil)
		switch {
		case err == nil && !res.AlreadyStored():
			return nil
		case err == nil:
			if _, err := k.b.n.repl.Delete(ctx, chunk.OpaqueKey(k.fp, key)); err != nil {
				return fmt.Errorf("replacing the value: %w", err)
			}
			deleted = true
		case deleted && errors.Is(err, replication.ErrTombstoned):
		default:
			return err
		}
	}
	return fmt.Errorf("%w: concurrent SETs of the key kept replacing it", respserver.ErrOtherValue)
}

// setAttempts bounds the writes of one SET that other SETs of its key
// keep replacing.
const setAttempts = 4

func (k *respKeyspace) Delete(ctx context.Context, key []byte) (bool, error) {
	if err := k.check(ctx, auth.ScopeWrite, "delete"); err != nil {
		return false, err
	}
	_, err := k.Len(ctx, key)
	if errors.Is(err, respserver.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := k.b.n.repl.Delete(ctx, chunk.OpaqueKey(k.fp, key)); err != nil {
		return false, err
	}
	return true, nil
}
