package chunk

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// ID is a 128-bit content or context ID: two xxhash64 lanes.
type ID struct{ Lo, Hi uint64 }

func (id ID) String() string { return fmt.Sprintf("%016x%016x", id.Hi, id.Lo) }

// IsZero reports whether id is the zero ID (the standalone context).
func (id ID) IsZero() bool { return id.Lo == 0 && id.Hi == 0 }

// Less orders IDs by (Hi, Lo), the order of their hex strings.
func (id ID) Less(o ID) bool { return id.Hi < o.Hi || (id.Hi == o.Hi && id.Lo < o.Lo) }

// ContextKind says what a chunk was encoded after.
type ContextKind uint8

const (
	// ContextStandalone: the chunk was encoded alone, at its own position 0.
	ContextStandalone ContextKind = 1
	// ContextWindow: encoded after the w tokens that preceded it (fewer when
	// it started within w tokens of the prompt start); only the chunk's KV
	// is kept (InferScale's context-window encoding).
	ContextWindow ContextKind = 2
	// ContextPrefix: encoded after its whole prefix, identified by the
	// prefix chain ID; such an entry is exact for that prefix.
	ContextPrefix ContextKind = 3
	// ContextOpaque: the entry is no chunk but an opaque value stored
	// under a byte-string key (chunk/opaque.go); its content ID hashes
	// that key, and it is never a match for a prompt.
	ContextOpaque ContextKind = 4
)

func (k ContextKind) String() string {
	switch k {
	case ContextStandalone:
		return "standalone"
	case ContextWindow:
		return "window"
	case ContextPrefix:
		return "prefix"
	case ContextOpaque:
		return "opaque"
	}
	return fmt.Sprintf("context(%d)", uint8(k))
}

// Valid reports whether k is a known kind.
func (k ContextKind) Valid() bool { return k >= ContextStandalone && k <= ContextOpaque }

// Context is what a chunk was encoded after: a kind and its ID (zero for
// standalone). Window is w for ContextWindow: the number of tokens the
// window asked for, which the ID alone does not say.
type Context struct {
	Kind   ContextKind
	Window uint32
	ID     ID
}

func (c Context) String() string {
	switch c.Kind {
	case ContextStandalone:
		return c.Kind.String()
	case ContextOpaque:
		if c.ID.IsZero() && c.Window == 0 {
			return c.Kind.String()
		}
	case ContextWindow:
		return fmt.Sprintf("window(%d):%s", c.Window, c.ID)
	}
	return fmt.Sprintf("%v:%s", c.Kind, c.ID)
}

// MaxWindow is the largest window w a window context may carry.
const MaxWindow = 1 << 24

// ErrNonCanonical is wrapped by the errors of a key that does not name its
// entry: a content ID other than the one its tokens give, or a context not
// in its one canonical form. Every decode of such an entry fails with it.
var ErrNonCanonical = errors.New("chunk: key does not name the entry")

// CheckCanonical reports whether c is in the one form its kind allows, so
// that two spellings of a context never name two entries: standalone has a
// zero ID and window, opaque and prefix a zero window (an opaque ID is a
// version), window a w in 1..MaxWindow.
func (c Context) CheckCanonical() error {
	switch c.Kind {
	case ContextStandalone:
		if !c.ID.IsZero() || c.Window != 0 {
			return fmt.Errorf("%w: %v context with ID %v and window %d (both must be zero)", ErrNonCanonical, c.Kind, c.ID, c.Window)
		}
	case ContextWindow:
		if c.Window == 0 || c.Window > MaxWindow {
			return fmt.Errorf("%w: window %d out of range 1..%d", ErrNonCanonical, c.Window, MaxWindow)
		}
	case ContextPrefix, ContextOpaque:
		if c.Window != 0 {
			return fmt.Errorf("%w: %v context with window %d (must be zero)", ErrNonCanonical, c.Kind, c.Window)
		}
	default:
		return fmt.Errorf("%w: context kind %v", ErrNonCanonical, c.Kind)
	}
	return nil
}

// Canonical is the one key context of the computation c names for a chunk
// of the model with fingerprint fp: one computation, one key. A chunk with
// nothing before it is encoded alone, so the prefix context at the root of
// the chain (PrefixRoot(fp)) and a window context of the empty window are
// the standalone context; any other context is returned as it is.
//
// The other equivalence, a window that holds every token before the chunk
// (the prefix encoding), cannot be seen in a key: the encoder that knows
// it keys the encoding by its prefix (WindowOrPrefix).
func Canonical(fp Fingerprint, c Context) Context {
	switch {
	case c.Kind == ContextPrefix && c.Window == 0 && c.ID == PrefixRoot(fp),
		c.Kind == ContextWindow && c.ID == WindowID(fp, nil):
		return StandaloneContext()
	}
	return c
}

// CheckKey reports whether k names an entry holding tokens: its content ID
// is the one tokens give under its fingerprint, and its context is
// canonical, in form (CheckCanonical) and as the one key of its
// computation (Canonical). What a node cannot check (the KV bytes, and
// that a window or prefix ID hashes the tokens the chunk was really
// encoded after) rests on trusting the writer; docs/SECURITY.md says how
// far.
func CheckKey(k Key, tokens []uint32) error {
	if err := k.Context.CheckCanonical(); err != nil {
		return err
	}
	if k.Context.Kind == ContextOpaque {
		// Its tokens are lengths (checkOpaque); DecodeOpaque checks the
		// content ID against the key it stores.
		return nil
	}
	if c := Canonical(k.Fingerprint, k.Context); c != k.Context {
		return fmt.Errorf("%w: context %v names the encoding of a chunk with nothing before it, which is keyed %v", ErrNonCanonical, k.Context, c)
	}
	if want := ContentID(k.Fingerprint, tokens); k.Content != want {
		return fmt.Errorf("%w: content ID %v, the %d tokens give %v", ErrNonCanonical, k.Content, len(tokens), want)
	}
	return nil
}

// Key names one stored encoding of a chunk.
type Key struct {
	Fingerprint Fingerprint
	Content     ID
	Context     Context
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s/%s", k.Fingerprint, k.Content, k.Context)
}

// CompareKeys is the one order of keys: content ID, then fingerprint, then
// context kind, window and context ID. Merges of sorted key
// lists and rebalancing walks all sort by it, so two nodes that exchange
// sorted lists agree on their order.
func CompareKeys(a, b Key) int {
	return cmp.Or(
		cmp.Compare(a.Content.Hi, b.Content.Hi), cmp.Compare(a.Content.Lo, b.Content.Lo),
		cmp.Compare(a.Fingerprint.Hi, b.Fingerprint.Hi), cmp.Compare(a.Fingerprint.Lo, b.Fingerprint.Lo),
		cmp.Compare(a.Context.Kind, b.Context.Kind), cmp.Compare(a.Context.Window, b.Context.Window),
		cmp.Compare(a.Context.ID.Hi, b.Context.ID.Hi), cmp.Compare(a.Context.ID.Lo, b.Context.ID.Lo),
	)
}

// Domain-separation constants XORed into the lane seeds, so a content ID, a
// window ID and a prefix ID of the same tokens never coincide. The values
// are ASCII tags (docs/KEYS.md).
const (
	domContentLo uint64 = 0x636f6e74656e742e // "content."
	domContentHi uint64 = 0x2e636f6e74656e74 // ".content"
	domWindowLo  uint64 = 0x77696e646f772e2e // "window.."
	domWindowHi  uint64 = 0x2e2e77696e646f77 // "..window"
	domPrefixLo  uint64 = 0x7072656669782e2e // "prefix.."
	domPrefixHi  uint64 = 0x2e2e707265666978 // "..prefix"
)

// hashTokens runs the two lanes over tokens as little-endian uint32s. It
// does not allocate: tokens go through a stack buffer.
func hashTokens(seedLo, seedHi uint64, tokens []uint32) ID {
	var lo, hi xxhash.Digest
	lo.ResetWithSeed(seedLo)
	hi.ResetWithSeed(seedHi)
	var buf [512]byte
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = lo.Write(buf[:4*n])
		_, _ = hi.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	return ID{Lo: lo.Sum64(), Hi: hi.Sum64()}
}

// ContentID names a chunk's tokens for one model, wherever they appear.
func ContentID(fp Fingerprint, tokens []uint32) ID {
	return hashTokens(fp.Lo^domContentLo, fp.Hi^domContentHi, tokens)
}

// WindowID names the tokens of a window (docs/KEYS.md).
func WindowID(fp Fingerprint, window []uint32) ID {
	return hashTokens(fp.Lo^domWindowLo, fp.Hi^domWindowHi, window)
}

// WindowContext is the context of a chunk encoded after window, the last w
// tokens before it. An empty window is the standalone context (nothing
// was computed before the chunk). A window that holds every token before
// the chunk is its prefix encoding, keyed by the prefix: an encoder that
// knows the prompt's chunks uses WindowOrPrefix, which says so.
func WindowContext(fp Fingerprint, w int, window []uint32) Context {
	if len(window) == 0 {
		return StandaloneContext()
	}
	return Context{Kind: ContextWindow, Window: uint32(w), ID: WindowID(fp, window)}
}

// WindowOrPrefix is the key context of a chunk encoded after the last w
// tokens of before, the chunks that precede it in its prompt, in order:
// their window context, or, when before holds at most w tokens (the window
// is every token before the chunk, the same computation as the prefix
// encoding), their prefix context; standalone when nothing precedes it.
func WindowOrPrefix(fp Fingerprint, w int, before [][]uint32) Context {
	n := 0
	for _, c := range before {
		n += len(c)
	}
	if n <= w {
		_, end := PrefixChain(fp, before)
		return Canonical(fp, PrefixContext(end))
	}
	all := make([]uint32, 0, n)
	for _, c := range before {
		all = append(all, c...)
	}
	return WindowContext(fp, w, all[n-w:])
}

// StandaloneContext is the context of a chunk encoded alone.
func StandaloneContext() Context { return Context{Kind: ContextStandalone} }

// PrefixRoot is the prefix chain ID of the empty prefix.
func PrefixRoot(fp Fingerprint) ID {
	return ID{Lo: fp.Lo ^ domPrefixLo, Hi: fp.Hi ^ domPrefixHi}
}

// NextPrefix extends a prefix chain by one chunk: the ID of the prefix that
// ends with tokens, given the ID of the prefix before them. A chunk encoded
// after its whole prefix has context PrefixContext(prefix before it). An
// empty chunk adds nothing to the computation, so it leaves the chain as
// it is.
func NextPrefix(prev ID, tokens []uint32) ID {
	if len(tokens) == 0 {
		return prev
	}
	return hashTokens(prev.Lo^domPrefixLo, prev.Hi^domPrefixHi, tokens)
}

// PrefixContext wraps a prefix chain ID as a Context.
func PrefixContext(prefix ID) Context { return Context{Kind: ContextPrefix, ID: prefix} }

// PrefixChain returns, for chunks in prompt order, the context of each (the
// prefix chain ID before it; standalone for a chunk with no token before
// it, as Canonical says) and the chain ID after the last.
func PrefixChain(fp Fingerprint, chunks [][]uint32) (contexts []Context, end ID) {
	root := PrefixRoot(fp)
	p := root
	contexts = make([]Context, len(chunks))
	for i, c := range chunks {
		contexts[i] = PrefixContext(p)
		if p == root {
			contexts[i] = StandaloneContext()
		}
		p = NextPrefix(p, c)
	}
	return contexts, p
}
