package node

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// FuzzPutKey sends one valid entry under fuzzed keys, its header checksum
// resealed so that only the key check stands in the way, through every
// write path (a client Put, a peer's Replicate of each kind): content IDs
// of its tokens or not, every context kind, window and ID, non-zero
// reserved bytes. The node must store it exactly when the key names the
// entry, by the rules of docs/KEYS.md written out here apart from
// chunk.CheckKey, and refuse it otherwise with InvalidArgument, changing
// nothing.
func FuzzPutKey(f *testing.F) {
	e := newFuzzEnv(f)
	fp := e.spec.Fingerprint()
	good := e.keys[0]
	root, emptyWindow := chunk.PrefixRoot(fp), chunk.WindowID(fp, nil)
	// contentSel: 0 the entry's own content ID, 1 another entry's, else lo/hi.
	for _, s := range []struct {
		path, contentSel, kind, reserved uint8
		window                           uint32
		lo, hi                           uint64
	}{
		{0, 0, 1, 0, 0, 0, 0},                           // canonical standalone
		{1, 0, 2, 0, 16, 1, 2},                          // a window
		{2, 0, 3, 0, 0, 3, 4},                           // a prefix
		{0, 1, 1, 0, 0, 0, 0},                           // another chunk's content ID
		{3, 2, 1, 0, 0, 0, 0},                           // a made-up content ID
		{0, 0, 1, 0, 4, 0, 0},                           // standalone with a window
		{4, 0, 1, 0, 0, 1, 0},                           // standalone with an ID
		{0, 0, 3, 0, 4, 3, 4},                           // prefix with a window
		{1, 0, 3, 0, 0, root.Lo, root.Hi},               // the chain's root: standalone
		{2, 0, 2, 0, 8, emptyWindow.Lo, emptyWindow.Hi}, // no tokens' window: standalone
		{0, 0, 2, 0, 0, 5, 6},                           // window 0
		{0, 0, 2, 0, chunk.MaxWindow + 1, 5, 6},         // window too wide
		{0, 0, 4, 0, 0, 0, 0},                           // unknown kind
		{0, 0, 1, 1, 0, 0, 0},                           // a reserved byte
	} {
		f.Add(s.path, s.contentSel, s.kind, s.reserved, s.window, s.lo, s.hi)
	}
	cl, pc := api.NewClientClient(e.cc), api.NewPeerClient(e.cc)
	f.Fuzz(func(t *testing.T, path, contentSel, kind, reserved uint8, window uint32, lo, hi uint64) {
		k := chunk.Key{Fingerprint: fp, Content: good.Content,
			Context: chunk.Context{Kind: chunk.ContextKind(kind), Window: window, ID: chunk.ID{Lo: lo, Hi: hi}}}
		switch contentSel % 3 {
		case 1:
			k.Content = e.keys[1].Content
		case 2:
			k.Content = chunk.ID{Lo: lo ^ hi, Hi: hi}
		}
		blob := slices.Clone(e.blobs[0])
		blob[41+int(reserved%3)] = reserved / 3
		blob = testutil.Relabel(blob, k)

		c := k.Context
		names := k.Content == good.Content && blob[41] == 0 && blob[42] == 0 && blob[43] == 0
		switch c.Kind {
		case chunk.ContextStandalone:
			names = names && c.Window == 0 && c.ID.IsZero()
		case chunk.ContextWindow:
			names = names && c.Window >= 1 && c.Window <= chunk.MaxWindow && c.ID != emptyWindow
		case chunk.ContextPrefix:
			names = names && c.Window == 0 && c.ID != root
		default:
			names = false
		}

		hdr := &api.PutHeader{Key: api.ProtoKey(k), BlobBytes: uint64(len(blob))}
		open, what := cl.Put, "Put"
		if p := path % 5; p > 0 {
			hdr.Direct, hdr.Kind, open, what = true, uint32(p), pc.Replicate, "Replicate"
		}
		before := e.state()
		ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		err := e.put(ctx, open, hdr, blob)
		cancel()
		e.check(t, what, err)
		switch code := status.Code(err); {
		case code == codes.DeadlineExceeded || code == codes.Canceled:
		case names && err != nil:
			t.Fatalf("%s of %v, a key that names the entry: %v", what, k, err)
		case names && !e.n.store.Contains(k):
			t.Fatalf("%s of %v succeeded but the node does not hold it", what, k)
		case !names && code != codes.InvalidArgument:
			t.Fatalf("%s of %v, a key that does not name the entry: %v, want InvalidArgument", what, k, err)
		case !names && e.state() != before:
			t.Fatalf("%s of %v refused but changed the node's state", what, k)
		}
	})
}
