package inject

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pinned"
)

// Local is the node's own store; *kvtier.Store implements it.
type Local interface {
	Best(fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, chunk.Match, error)
	Get(ctx context.Context, key chunk.Key) (pinned.Bytes, error)
}

// DeviceCopy is a local entry lent in device memory (the node's GPU
// tier). Its encoded bytes (chunk.Encode's format) start at device address
// Ptr, in this process's primary context of the device, where the
// Service's device caches run their kernels, so a layer's source is Ptr +
// Header.PayloadStart + its Offset. Header is the entry's header, parsed
// from the host bytes the copy was made of, whose every layer then matched
// its checksum: the Service reads no byte of the copy on the host. Release
// unpins the copy; the Service calls it exactly once, after every kernel
// reading the copy has finished.
type DeviceCopy struct {
	Ptr     uint64
	Header  *chunk.Header
	Release func()
}

// DeviceLocal is a Local that can lend its entries in device memory; the
// node implements it over kvtier's GPU tier.
type DeviceLocal interface {
	Local
	// GetDevice lends the entry stored under key in the memory of CUDA
	// device `device`, moving it there from another tier, when it is
	// stored in one of codecs. Otherwise it fails (no GPU tier on that
	// device, no room there, another codec, bytes that fail their checks,
	// not found), moving nothing, and the caller reads the entry with Get.
	GetDevice(ctx context.Context, key chunk.Key, device int, codecs []chunk.Codec) (DeviceCopy, error)
}

// Remote reaches the other replicas of a content ID; the node implements
// it over gRPC (a direct Lookup to the replica set, then a Fetch stream).
type Remote interface {
	// Best returns the best key the replicas hold for content wanted in
	// context want, as chunk.Better ranks them, or chunk.MatchMiss.
	Best(ctx context.Context, fp chunk.Fingerprint, content chunk.ID, want chunk.Context) (chunk.Key, chunk.Match, error)
	// Get reads key from a replica that holds it.
	Get(ctx context.Context, key chunk.Key) ([]byte, error)
}

// Refetcher is a Fetcher that can replace a local entry found corrupt.
// The Service calls Refetch once for a chunk whose local entry (Fetched
// with Local set) fails verification: it drops the local copy stored
// (Fetched.Key) and finds want again, from the replicas then; the local
// copy is repaired from theirs. It answers as Fetch does.
type Refetcher interface {
	Refetch(ctx context.Context, stored, want chunk.Key, why error) (Fetched, error)
}

// Found is a replica set's answer for one key: the best key it holds and
// how it fits, or why it could not answer.
type Found struct {
	Key   chunk.Key
	Match chunk.Match
	Err   error
	// From names the replica whose answer this is (opaque here: the
	// Remote's own name for it), so a StreamRemote reads it there.
	From string
}

// BatchRemote is a Remote that ranks many keys at once: one Lookup per
// replica node for all the keys it owns, instead of one per key.
type BatchRemote interface {
	Remote
	// BestBatch is Best for every key (key.Context is the wanted context):
	// out[i] answers keys[i].
	BestBatch(ctx context.Context, keys []chunk.Key) []Found
}

// StreamRemote is a BatchRemote that reads many entries at once: one
// stream per replica node, carrying every entry read from it, each handed
// over as soon as its head arrived, its layers following (Fetched.Arriving).
type StreamRemote interface {
	BatchRemote
	// GetMany reads keys[i] (a key BestBatch found) from the replica
	// from[i] (its Found.From) and calls got(i, f, err) exactly once for
	// each key, from any goroutine, possibly concurrently: when its head
	// arrived (f.Blob has the whole size, f.Arriving tells when each layer
	// is in place) or it failed. It returns once every call returned; if
	// ctx ends, the keys not yet answered get an error.
	GetMany(ctx context.Context, keys []chunk.Key, from []string, got func(i int, f Fetched, err error))
}

// TierFetcher is the node's Fetcher: an exact entry wherever it is, local
// first; else the best approximate one as chunk.Better ranks them, local when
// the replicas hold none better (no network).
// Local blobs are pinned in their tier until the Service releases them.
// It is a DeviceFetcher: with a Local that is a DeviceLocal, an exact local
// entry for a cache in device memory is lent there (Fetched.Device) when
// its codec has a device decoder and the device copy can be had, and read
// on the host otherwise.
type TierFetcher struct {
	Local Local
	// Remote may be nil (a single node, or tests): local entries only.
	// When it is a BatchRemote, FetchBatch ranks all keys with it at once.
	Remote Remote
	// Parallel bounds the concurrent reads of one FetchBatch (local tier
	// reads and replica Fetch streams). Default DefaultFetchParallel.
	Parallel int
}

// Fetch implements Fetcher.
func (f TierFetcher) Fetch(ctx context.Context, key chunk.Key) (Fetched, error) {
	lf, done := f.localExact(ctx, key)
	if done {
		return lf.got, nil
	}
	var rf Found
	if f.Remote != nil {
		rf.Key, rf.Match, rf.Err = f.Remote.Best(ctx, key.Fingerprint, key.Content, key.Context)
	}
	return f.resolve(ctx, lf, rf)
}

// FetchBatch implements BatchFetcher: every key's local tier first, then
// one BestBatch over the keys without a local exact entry (a Lookup per
// replica node rather than per chunk), then the entry reads, at most
// Parallel at once. found is called as each key is settled.
func (f TierFetcher) FetchBatch(ctx context.Context, keys []chunk.Key, found func(i int, got Fetched, err error)) {
	f.fetchBatch(ctx, noDevice, keys, found)
}

// FetchBatchDevice implements DeviceFetcher: FetchBatch, with the local
// exact entries lent in the memory of device when the Local can
// (DeviceLocal.GetDevice, in a codec the kernels decode).
func (f TierFetcher) FetchBatchDevice(ctx context.Context, device int, keys []chunk.Key, found func(i int, got Fetched, err error)) {
	f.fetchBatch(ctx, device, keys, found)
}

// noDevice is fetchBatch's device for a cache in host memory.
const noDevice = -1

// deviceCodecs are the codecs an entry lent in device memory may have.
var deviceCodecs = cudakern.DeviceCodecs()

func (f TierFetcher) fetchBatch(ctx context.Context, device int, keys []chunk.Key, found func(i int, got Fetched, err error)) {
	par := f.Parallel
	if par <= 0 {
		par = DefaultFetchParallel
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	goBounded := func(fn func()) bool {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn()
		}()
		return true
	}
	defer wg.Wait()
	locals := make([]localAnswer, len(keys))
	var pending []int // keys without a local exact entry
	for i, key := range keys {
		lf, done := f.localBest(key)
		locals[i] = lf
		if !done {
			pending = append(pending, i)
			continue
		}
		// A local exact entry: pin it (a disk tier read may take a while).
		if !goBounded(func() {
			got, ok := f.localGet(ctx, &locals[i], device)
			if ok {
				found(i, got, nil)
				return
			}
			// Evicted since Best: settle it with the replicas, alone.
			var rf Found
			if f.Remote != nil {
				rf.Key, rf.Match, rf.Err = f.Remote.Best(ctx, key.Fingerprint, key.Content, key.Context)
			}
			got, err := f.resolve(ctx, locals[i], rf)
			found(i, got, err)
		}) {
			found(i, Fetched{}, ctx.Err())
		}
	}
	if len(pending) == 0 {
		return
	}
	remote := make([]Found, len(keys))
	switch br, ok := f.Remote.(BatchRemote); {
	case f.Remote == nil:
	case ok:
		ks := make([]chunk.Key, len(pending))
		for j, i := range pending {
			ks[j] = keys[i]
		}
		for j, a := range br.BestBatch(ctx, ks) {
			remote[pending[j]] = a
		}
	default:
		var rw sync.WaitGroup
		for _, i := range pending {
			key := keys[i]
			rw.Add(1)
			if !goBounded(func() {
				defer rw.Done()
				remote[i].Key, remote[i].Match, remote[i].Err = f.Remote.Best(ctx, key.Fingerprint, key.Content, key.Context)
			}) {
				rw.Done()
				remote[i].Err = ctx.Err()
			}
		}
		rw.Wait()
	}
	// Keys a StreamRemote reads from the replicas go in one GetMany (a
	// stream per replica node); the others resolve one by one.
	sr, streams := f.Remote.(StreamRemote)
	var many []int
	for _, i := range pending {
		if streams && remote[i].Err == nil && remoteFirst(locals[i], remote[i]) {
			many = append(many, i)
			continue
		}
		if !goBounded(func() {
			got, err := f.resolve(ctx, locals[i], remote[i])
			found(i, got, err)
		}) {
			found(i, Fetched{}, ctx.Err())
		}
	}
	if len(many) == 0 {
		return
	}
	ks := make([]chunk.Key, len(many))
	from := make([]string, len(many))
	for j, i := range many {
		ks[j], from[j] = remote[i].Key, remote[i].From
	}
	sr.GetMany(ctx, ks, from, func(j int, got Fetched, err error) {
		i := many[j]
		if err == nil {
			got.Match = remote[i].Match
			found(i, got, nil)
			return
		}
		got, err = f.fallback(ctx, locals[i], err)
		found(i, got, err)
	})
}

// remoteFirst says whether the replicas' answer rf beats the local one la:
// an exact replica entry, or a better approximate one (chunk.Better; the
// local one when they are the same encoding: no network).
func remoteFirst(la localAnswer, rf Found) bool {
	return rf.Match == chunk.MatchExact ||
		(rf.Match == chunk.MatchApproximate && (la.match == chunk.MatchMiss || chunk.Better(la.want, rf.Key.Context, la.key.Context)))
}

// localAnswer is the local tier's ranking of one key.
type localAnswer struct {
	want  chunk.Context // the wanted context
	key   chunk.Key     // the best local key, when match is not a miss
	match chunk.Match
	err   error
	got   Fetched
}

// localBest ranks key in the local tier; done means an exact entry is
// there (not yet pinned).
func (f TierFetcher) localBest(key chunk.Key) (localAnswer, bool) {
	a := localAnswer{want: key.Context}
	a.key, a.match, a.err = f.Local.Best(key.Fingerprint, key.Content, key.Context)
	if a.err != nil {
		a.match = chunk.MatchMiss
	}
	return a, a.match == chunk.MatchExact
}

// localGet pins a local exact entry, in the memory of device when it is
// not noDevice and the Local can lend it there; on failure (evicted since
// Best) a becomes a local miss.
func (f TierFetcher) localGet(ctx context.Context, a *localAnswer, device int) (Fetched, bool) {
	if dl, ok := f.Local.(DeviceLocal); ok && device != noDevice {
		if dc, err := dl.GetDevice(ctx, a.key, device, deviceCodecs); err == nil {
			return Fetched{Device: &dc, Local: true, Key: a.key, Match: chunk.MatchExact}, true
		}
		// Not to be had on the device: read it on the host.
	}
	got, err := f.local(ctx, a.key, chunk.MatchExact)
	if err == nil {
		return got, true
	}
	a.match = chunk.MatchMiss
	return Fetched{}, false
}

// localExact is localBest and localGet.
func (f TierFetcher) localExact(ctx context.Context, key chunk.Key) (localAnswer, bool) {
	a, exact := f.localBest(key)
	if !exact {
		return a, false
	}
	a.got, exact = f.localGet(ctx, &a, noDevice)
	return a, exact
}

// resolve settles a key without a local exact entry from the replicas'
// answer rf: an exact replica entry, else the better of the local and the
// replicas' approximate entries (chunk.Better; the local one when they are
// the same encoding: no network). A local entry serves when the replicas'
// read fails.
func (f TierFetcher) resolve(ctx context.Context, la localAnswer, rf Found) (Fetched, error) {
	rerr := rf.Err
	if f.Remote != nil && rerr == nil && remoteFirst(la, rf) {
		blob, err := f.Remote.Get(ctx, rf.Key)
		if err == nil {
			return Fetched{Blob: pinned.Owned(blob), Match: rf.Match}, nil
		}
		rerr = err
	}
	return f.fallback(ctx, la, rerr)
}

// fallback settles a key the replicas did not serve (rerr: why, nil when
// they hold nothing better): the local approximate entry if there is one,
// else a miss.
func (f TierFetcher) fallback(ctx context.Context, la localAnswer, rerr error) (Fetched, error) {
	if la.match == chunk.MatchApproximate {
		if got, err := f.local(ctx, la.key, chunk.MatchApproximate); err == nil {
			return got, nil
		}
	}
	if rerr != nil {
		return Fetched{}, fmt.Errorf("inject: replicas: %w", rerr)
	}
	return Fetched{Match: chunk.MatchMiss}, la.err
}

func (f TierFetcher) local(ctx context.Context, key chunk.Key, m chunk.Match) (Fetched, error) {
	b, err := f.Local.Get(ctx, key)
	if err != nil {
		return Fetched{}, err
	}
	return Fetched{Blob: b, Local: true, Key: key, Match: m}, nil
}
