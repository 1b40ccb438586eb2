package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/replication"
	"github.com/kvmesh/kvmesh/respserver"
	"github.com/kvmesh/kvmesh/ring"
)

// RESPConfig is the configuration of this node's Redis-protocol door
// (kvmeshd -resp): its Backend, the node's TLS, the entry limits, and the
// node's metrics and refusal counter. Zero fields take
// respserver.DefaultConfig's values.
func (n *Node) RESPConfig() respserver.Config {
	clock := &n.respClock
	cfg := respserver.Config{
		Backend:      &respBackend{n: n, clock: clock},
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
		cfg.Backend = &respBackend{n: n, verifier: auth.NewVerifier(n.meta), clock: clock}
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
	clock    *versionClock
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

// newest returns the key of the newest version of key's value that its
// replicas hold (chunk.OpaqueNewer; values written before versions are
// version zero). It asks every replica at once and decides once R-W+1 of
// them answered: any R-W+1 include one of the W that acknowledged the
// last SET. With fewer answers it takes the best of those it got, and
// fails only when no replica answered. Where no replica holds a version
// and a ring change may still be moving the key, it asks the key's
// previous owners too (replication's Fallbacks, as a Read does).
func (k *respKeyspace) newest(ctx context.Context, key []byte) (chunk.Key, error) {
	n := k.b.n
	if _, ok := n.meta.Model(k.fp); !ok {
		// No SET of this keyspace yet (the first registers its model).
		return chunk.Key{}, fmt.Errorf("%w: no value in this keyspace", respserver.ErrNotFound)
	}
	rf, w := n.quorum()
	content := chunk.OpaqueID(k.fp, key)
	reps := n.meta.Ring().Replicas(content, rf)
	if len(reps) == 0 {
		return chunk.Key{}, fmt.Errorf("%w: the cluster has no ring yet", replication.ErrUnavailable)
	}
	best, answered, err := k.ask(ctx, content, reps, len(reps)-min(w, len(reps))+1)
	if answered == 0 {
		return chunk.Key{}, fmt.Errorf("%w: no replica of the key answered: %w", replication.ErrUnavailable, err)
	}
	if best == nil {
		var more []ring.Member
		for _, m := range n.repl.Fallbacks(content) {
			if !isMemberOf(reps, m.ID) {
				more = append(more, m)
			}
		}
		if len(more) > 0 {
			best, _, _ = k.ask(ctx, content, more, len(more))
		}
	}
	found, ok := hitOf(best)
	if !ok {
		return chunk.Key{}, fmt.Errorf("%w: no replica holds the key", respserver.ErrNotFound)
	}
	return found, nil
}

// ask sends a direct lookup of the newest version of content to each of
// members at once and returns the best answer once need of them answered
// (or all that could), how many answered, and the failures.
func (k *respKeyspace) ask(ctx context.Context, content chunk.ID, members []ring.Member, need int) (*api.LookupResult, int, error) {
	n := k.b.n
	items := []lookupItem{{content: content, want: chunk.OpaqueNewest()}}
	type answer struct {
		res *api.LookupResult
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the members not waited for
	answers := make(chan answer, len(members))
	pfp := api.ProtoFingerprint(k.fp)
	for _, m := range members {
		if m.ID == n.cfg.NodeID {
			answers <- answer{res: n.lookupLocal(k.fp, items)[0]}
			continue
		}
		go func() {
			res, err := n.remoteLookup(ctx, m.GRPCAddr, pfp, items)
			if err != nil {
				answers <- answer{err: fmt.Errorf("%s: %w", m.ID, err)}
				return
			}
			answers <- answer{res: res[0]}
		}()
	}
	var best *api.LookupResult
	var errs []error
	answered := 0
	for range members {
		a := <-answers
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		if betterAnswer(chunk.OpaqueNewest(), a.res, best) {
			best = a.res
		}
		if answered++; answered >= need {
			break
		}
	}
	return best, answered, errors.Join(errs...)
}

func isMemberOf(ms []ring.Member, id string) bool {
	return slices.ContainsFunc(ms, func(m ring.Member) bool { return m.ID == id })
}

// read returns the stored entry of the newest version of key; release
// it. A version retired between the lookup and the read (a SET of the key
// replaced it) sends it back to the lookup, which finds the newer one.
func (k *respKeyspace) read(ctx context.Context, key []byte) (replication.ReadResult, error) {
	if err := k.check(ctx, auth.ScopeRead, "read"); err != nil {
		return replication.ReadResult{}, err
	}
	var err error
	for range readAttempts {
		var found chunk.Key
		if found, err = k.newest(ctx, key); err != nil {
			return replication.ReadResult{}, err
		}
		var rr replication.ReadResult
		rr, err = k.b.n.repl.Read(ctx, found)
		if !errors.Is(err, replication.ErrNotFound) && status.Code(err) != codes.NotFound {
			return rr, err
		}
	}
	return replication.ReadResult{}, fmt.Errorf("%w: %w", respserver.ErrNotFound, err)
}

// readAttempts bounds the lookups of one read whose version SETs of the
// key keep retiring.
const readAttempts = 3

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

// Set writes value as a new version of key (versionClock), acknowledged
// once W replicas hold it; each replica that stores it retires the older
// versions it holds, so the old value stays readable until the new one
// is. SETs of one key through this node run one at a time, so their
// versions reach the replicas in order.
//
// A replica that holds or deleted a newer version refuses the write as
// tombstoned. Either this node's clock is behind the node that wrote it
// (an earlier SET must stay earlier: the write is stamped past the newest
// version the replicas hold, and sent again), or that SET ran at the same
// time as this one. A newer version that the first look-up did not find
// was not acknowledged before this SET began, so this SET is done: it
// came just before that one.
func (k *respKeyspace) Set(ctx context.Context, key, value []byte) error {
	if err := k.check(ctx, auth.ScopeWrite, "write"); err != nil {
		return err
	}
	if err := k.register(ctx); err != nil {
		return err
	}
	defer k.b.clock.lock(chunk.OpaqueID(k.fp, key))()
	var seen chunk.ID
	for attempt := range setAttempts {
		v := k.b.clock.next(k.b.n.cfg.NodeID, time.Now(), seen)
		blob, err := chunk.EncodeOpaque(nil, k.fp, key, value, v, k.b.n.cfg.Limits)
		if errors.Is(err, chunk.ErrTooLarge) {
			return fmt.Errorf("%w: %w", respserver.ErrTooLarge, err)
		}
		if err != nil {
			return err
		}
		_, err = k.b.n.repl.WriteOwned(ctx, blob, nil)
		if !errors.Is(err, replication.ErrTombstoned) {
			return err
		}
		found, ferr := k.newest(ctx, key)
		if ferr == nil && chunk.OpaqueNewer(found.Context, chunk.OpaqueContextAt(v)) {
			if attempt > 0 {
				return nil
			}
			seen = found.Context.ID
			continue
		}
		// No replica names a newer version: a deleted one refused it.
		// Ahead by a growing step.
		seen = chunk.ID{Hi: v.Hi + uint64(setStep)<<(4*attempt)}
	}
	return fmt.Errorf("%w: replicas deleted versions of the key newer than this node's clock gives (clocks more than %v apart)",
		respserver.ErrOtherValue, setReach)
}

// setAttempts bounds the writes of one SET that replicas refuse as older
// than a version they hold or deleted; each is stamped setStep, then 16
// and 256 times that, past the one before, so that a node whose clock is
// up to setReach behind another still writes after it.
const (
	setAttempts = 4
	setStep     = time.Millisecond
	setReach    = setStep * (1 + 16 + 256)
)

// versionClock stamps the versions this node's door writes: a hybrid
// logical clock in Hi (nanoseconds since the Unix epoch, raised past every
// stamp it gave and every version it was told of) and the node in Lo
// (XXH64 of its ID), which breaks ties between nodes. docs/KEYS.md. Its
// key locks put the SETs of one key through this node in a row.
type versionClock struct {
	mu   sync.Mutex
	last uint64
	keys [256]sync.Mutex
}

// lock locks the SETs of the key whose content ID is id and returns the
// unlock.
func (c *versionClock) lock(id chunk.ID) func() {
	mu := &c.keys[id.Lo%uint64(len(c.keys))]
	mu.Lock()
	return mu.Unlock
}

// next is a stamp of node newer than every one given before and than
// seen.
func (c *versionClock) next(node string, now time.Time, seen chunk.ID) chunk.ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = max(uint64(now.UnixNano()), c.last+1, seen.Hi+1)
	return chunk.ID{Hi: c.last, Lo: xxhash.Sum64String(node)}
}

func (k *respKeyspace) Delete(ctx context.Context, key []byte) (bool, error) {
	if err := k.check(ctx, auth.ScopeWrite, "delete"); err != nil {
		return false, err
	}
	// A delete of the newest version retires the older ones on every
	// replica that takes it (replication/versions.go).
	found, err := k.newest(ctx, key)
	if errors.Is(err, respserver.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := k.b.n.repl.Delete(ctx, found); err != nil {
		return false, err
	}
	return true, nil
}
