// Package pinned is the one shape of "bytes lent until you say you are
// done": a store's pinned view of an entry, a pooled buffer, a blob read
// from a peer. Stores, replication, injection and the gRPC layer all hand
// bytes over as a Bytes, so there is one rule to learn. It imports nothing
// of ours, so every layer can use it.
package pinned

// Bytes lends a read-only byte slice. The lender owns the bytes (they may
// be a view of a store's pages, shared with other readers): the holder
// reads them, never writes them, and calls Release exactly once when done.
// After Release the lender may reuse, move or unmap the bytes, so neither
// the slice nor any sub-slice of it may be used again.
//
// Release clears the Bytes it is called on, so a second Release through
// the same variable does nothing. A copy of a Bytes lends the same bytes
// under the same pin: release through one of the copies only (releasing
// each copy would free the pin twice). The zero Bytes is empty and its
// Release does nothing.
type Bytes struct {
	b []byte
	r Releaser
}

// Releaser frees what a lender holds for a Bytes (a pin, a pool slot, a
// serving count). Release is called once per lent Bytes.
type Releaser interface {
	Release()
}

// ReleaseFunc adapts a function to a Releaser.
type ReleaseFunc func()

// Release calls f.
func (f ReleaseFunc) Release() { f() }

// New lends b, held until r.Release is called; a nil r means nothing is
// held (as Owned).
func New(b []byte, r Releaser) Bytes { return Bytes{b: b, r: r} }

// NewFunc lends b, held until release is called; a nil release means
// nothing is held (as Owned).
func NewFunc(b []byte, release func()) Bytes {
	if release == nil {
		return Bytes{b: b}
	}
	return Bytes{b: b, r: ReleaseFunc(release)}
}

// Owned wraps bytes that nobody else holds (a private copy, a buffer read
// off the network): the garbage collector frees them, and Release only
// drops the reference. The holder may keep them.
func Owned(b []byte) Bytes { return Bytes{b: b} }

// Bytes returns the lent bytes (nil after Release). Read them only.
func (p Bytes) Bytes() []byte { return p.b }

// Len is len(p.Bytes()).
func (p Bytes) Len() int { return len(p.b) }

// Held reports whether Release frees something of the lender's (the bytes
// are a pinned view rather than Owned).
func (p Bytes) Held() bool { return p.r != nil }

// Release ends the loan: it frees what the lender holds for the bytes and
// clears p. A second Release of p does nothing.
func (p *Bytes) Release() {
	r := p.r
	*p = Bytes{}
	if r != nil {
		r.Release()
	}
}

// Then returns p with after run once p's own release is done: a lender
// that adds something of its own to a loan (a serving count on top of a
// store's pin) without copying the bytes. It allocates one small value.
func (p Bytes) Then(after Releaser) Bytes {
	if after == nil {
		return p
	}
	if p.r == nil {
		return Bytes{b: p.b, r: after}
	}
	return Bytes{b: p.b, r: &chain{first: p.r, then: after}}
}

type chain struct{ first, then Releaser }

func (c *chain) Release() {
	c.first.Release()
	c.then.Release()
}
