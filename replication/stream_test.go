package replication

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

// streamTransport is the test network with streams that hold references:
// a stream holds the pieces sent to it, as a transport's send queue does,
// and delivers their bytes to the replica at Close. A replica that goes
// down fails the next Send.
type streamTransport struct {
	*InmemTransport
	opened atomic.Int64
	// slow, if set, is a node with no connection up: a stream to it opens
	// only when one may wait.
	slow string
}

func (t *streamTransport) OpenReplicate(ctx context.Context, node string, key chunk.Key, size int, opts ReplicateOptions, wait bool) (ReplicaStream, error) {
	if node == t.slow && !wait {
		return nil, ErrNoStreamNow
	}
	if _, err := t.n.Route(ctx, t.from, node); err != nil {
		return nil, err
	}
	t.opened.Add(1)
	return &memStream{t: t, ctx: ctx, node: node, opts: opts}, nil
}

type memStream struct {
	t      *streamTransport
	ctx    context.Context
	node   string
	opts   ReplicateOptions
	pieces []Piece
	ended  bool
}

func (s *memStream) Send(p Piece) error {
	if _, err := s.t.n.Route(s.ctx, s.t.from, s.node); err != nil {
		return err
	}
	p.Ref()
	s.pieces = append(s.pieces, p)
	return nil
}

func (s *memStream) drop() {
	for _, p := range s.pieces {
		p.Free()
	}
	s.pieces, s.ended = nil, true
}

func (s *memStream) Close() (uint64, error) {
	var blob []byte // a copy, as on a wire
	for _, p := range s.pieces {
		for _, b := range p.Parts(nil) {
			blob = append(blob, b...)
		}
	}
	s.drop()
	r, err := s.t.n.Route(s.ctx, s.t.from, s.node)
	if err != nil {
		return 0, err
	}
	return serveReceived(s.ctx, r, blob, s.opts)
}

func (s *memStream) Abort() { s.drop() }

// countedPiece is a Piece whose references a test counts.
type countedPiece struct {
	data []byte
	refs *atomic.Int32
}

func (p countedPiece) Parts(dst [][]byte) [][]byte { return append(dst, p.data) }
func (p countedPiece) Len() int                    { return len(p.data) }
func (p countedPiece) Ref()                        { p.refs.Add(1) }
func (p countedPiece) Free()                       { p.refs.Add(-1) }

// streamCluster is a 3-node cluster (R=3, W=2) whose transports stream.
func streamCluster(t *testing.T) (*cluster, map[string]*streamTransport) {
	ts := map[string]*streamTransport{}
	var mu sync.Mutex
	c := newCluster(t, []string{"a", "b", "c"}, func(id string, cfg *Config) {
		st := &streamTransport{InmemTransport: cfg.Transport.(*InmemTransport)}
		mu.Lock()
		ts[id] = st
		mu.Unlock()
		cfg.Transport = st
	})
	return c, ts
}

// TestStreamWrite: a write whose entry arrives in pieces opens a stream to
// each remote replica at once and passes each piece on as it comes; the
// streams hold no piece once the write ends, however it ends, and the
// caller's release runs exactly once, after failures too. A replica lost
// mid-entry gets a hint; an aborted write stores nothing anywhere.
func TestStreamWrite(t *testing.T) {
	blob, key := makeSizedBlob(t, 7, 0, 64, 4)
	hd, err := chunk.ParseHeader(blob, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// send passes blob to sw in three pieces and returns their reference count.
	send := func(sw *StreamWrite, upto int) *atomic.Int32 {
		refs := new(atomic.Int32)
		cut := []int{0, upto / 3, 2 * upto / 3, upto}
		for i := range 3 {
			sw.Send(countedPiece{blob[cut[i]:cut[i+1]], refs})
		}
		return refs
	}
	for _, tc := range []struct {
		name     string
		down     string // goes down after the first pieces
		abort    bool
		stored   []string
		hints    int
		sendPart int // bytes sent through Send before Finish
	}{
		{name: "all up", stored: []string{"a", "b", "c"}, sendPart: len(blob)},
		{name: "part sent, rest at finish", stored: []string{"a", "b", "c"}, sendPart: len(blob) / 2},
		{name: "replica lost mid-entry", down: "c", stored: []string{"a", "b"}, hints: 1, sendPart: len(blob)},
		{name: "aborted", abort: true, sendPart: len(blob) / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ts := streamCluster(t)
			a := c.reps["a"]
			sw, err := a.BeginWrite(key, len(blob))
			if err != nil {
				t.Fatal(err)
			}
			if got := ts["a"].opened.Load(); got != 2 {
				t.Fatalf("%d streams opened, want one per remote replica (2)", got)
			}
			if tc.down != "" { // after its stream opened
				c.net.SetDown(tc.down, true)
			}
			refs := send(sw, tc.sendPart)
			var released atomic.Int32
			if tc.abort {
				sw.Abort()
			} else {
				res, err := sw.Finish(t.Context(), blob, hd.Checksum, func() { released.Add(1) })
				if err != nil {
					t.Fatal(err)
				}
				if res.Kept != hd.Checksum || len(res.StoredOn) < 2 {
					t.Fatalf("result %+v", res)
				}
			}
			a.Close() // waits for the replica writes still in flight
			if got := refs.Load(); got != 0 {
				t.Errorf("streams still hold %d references to the pieces", got)
			}
			if want := int32(1); !tc.abort && released.Load() != want {
				t.Errorf("release ran %d times, want once", released.Load())
			}
			if got := c.holders(key); len(got) != len(tc.stored) {
				t.Errorf("stored on %v, want %v", got, tc.stored)
			}
			if n, _ := a.HintsPending(); n != tc.hints {
				t.Errorf("%d hints, want %d", n, tc.hints)
			}
		})
	}
	t.Run("replica not connected", func(t *testing.T) {
		// The pieces go on to the replica that is connected; the other is
		// not waited for, and gets the whole entry at Finish.
		c, ts := streamCluster(t)
		ts["a"].slow = "c"
		a := c.reps["a"]
		sw, err := a.BeginWrite(key, len(blob))
		if err != nil {
			t.Fatal(err)
		}
		refs := send(sw, len(blob))
		if got := refs.Load(); got != 3 {
			t.Fatalf("%d references to the 3 pieces held, want 3 (b's stream only)", got)
		}
		var released atomic.Int32
		res, err := sw.Finish(t.Context(), blob, hd.Checksum, func() { released.Add(1) })
		if err != nil || len(res.StoredOn) < 2 {
			t.Fatalf("finish: %+v, %v", res, err)
		}
		a.Close()
		if got := c.holders(key); len(got) != 3 || refs.Load() != 0 || released.Load() != 1 {
			t.Fatalf("stored on %v, %d references held, released %d times", got, refs.Load(), released.Load())
		}
	})
	t.Run("finish with other bytes than announced", func(t *testing.T) {
		c, _ := streamCluster(t)
		sw, err := c.reps["a"].BeginWrite(key, len(blob)+1)
		if err != nil {
			t.Fatal(err)
		}
		refs := send(sw, len(blob))
		var released atomic.Int32
		if _, err := sw.Finish(t.Context(), blob, hd.Checksum, func() { released.Add(1) }); err == nil {
			t.Fatal("finished an entry of another size than announced")
		}
		// Finishing again, or after an abort, fails and releases too.
		if _, err := sw.Finish(t.Context(), blob, hd.Checksum, func() { released.Add(1) }); err == nil {
			t.Fatal("finished a write twice")
		}
		c.reps["a"].Close()
		if refs.Load() != 0 || len(c.holders(key)) != 0 {
			t.Fatalf("refs %d, holders %v", refs.Load(), c.holders(key))
		}
		if released.Load() != 2 {
			t.Fatalf("release ran %d times for two failed finishes, want 2", released.Load())
		}
	})
	t.Run("owned write that fails before any replica write", func(t *testing.T) {
		c, _ := streamCluster(t)
		var released atomic.Int32
		if _, err := c.reps["a"].WriteOwned(t.Context(), blob[:10], func() { released.Add(1) }); err == nil {
			t.Fatal("wrote a torn entry")
		}
		c.reps["a"].Close()
		if _, err := c.reps["a"].WriteOwned(t.Context(), blob, func() { released.Add(1) }); err == nil {
			t.Fatal("wrote through a closed replicator")
		}
		if released.Load() != 2 {
			t.Fatalf("release ran %d times for two failed writes, want 2", released.Load())
		}
	})
}
