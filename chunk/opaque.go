package chunk

import (
	"bytes"
	"fmt"
)

// Opaque values are byte strings stored under byte-string keys (the
// Redis-protocol door, package resp) rather than KV tensors. Each is one
// entry of an opaque model, so that it moves through the same replicas,
// tiers, codecs and limits as a chunk:
//
//   - the model is OpaqueSpec(namespace): one layer of one head of 256
//     bf16 dims, so a token is OpaqueTokenBytes of payload;
//   - the key is OpaqueKeyAt(fp, key, version): content ID OpaqueID(fp,
//     key), a hash of the key bytes in a domain of its own, and context
//     opaque with the version as its ID (OpaqueContextAt);
//   - the tokens are [len(key), len(value)] and zeros up to the fewest
//     tokens whose raw bytes hold both (at least 2);
//   - the KV bytes are key, value and zeros up to the raw size.
//
// Opaque entries are stored raw or lossless, never in a lossy codec.
// ParseHeader checks their form; DecodeOpaque checks that the stored key
// hashes to the content ID, since the tokens do not carry it.
//
// Each SET of a key writes a new version, a key of its own, so replicas
// never choose between two values of one key by their bytes: the newest
// version (OpaqueNewer) is the value, and a replica that stores it retires
// the older ones. Version zero is an entry written before versions
// (OpaqueKey); every other version is a writer's stamp.

// OpaqueTokenBytes is the raw size of one token of an opaque entry.
const OpaqueTokenBytes = 2 * 256 * 2

// OpaqueFamily is the family of the opaque models.
const OpaqueFamily = "kvmesh-opaque"

// OpaqueSpec is the model of the opaque values of one namespace (its
// Salt); different namespaces never share a key.
func OpaqueSpec(namespace string) ModelSpec {
	return ModelSpec{Family: OpaqueFamily, Layers: 1, KVHeads: 1, HeadDim: 256, DType: BF16,
		RopeStyle: RopeNeoX, RopeTheta: 10000, Salt: namespace}
}

func opaqueShape(tokens int) Shape {
	return Shape{DType: BF16, Tokens: tokens, Layers: 1, KVHeads: 1, HeadDim: 256}
}

const (
	domOpaqueLo uint64 = 0x6f70617175652e2e // "opaque.."
	domOpaqueHi uint64 = 0x2e2e6f7061717565 // "..opaque"
)

// OpaqueID names the opaque value stored under key for the opaque model
// fp.
func OpaqueID(fp Fingerprint, key []byte) ID {
	return ID{Lo: xxhash64Seed(fp.Lo^domOpaqueLo, key), Hi: xxhash64Seed(fp.Hi^domOpaqueHi, key)}
}

// OpaqueContext is the context of an opaque entry of version zero: one
// written before versions, which every versioned entry of its key
// replaces.
func OpaqueContext() Context { return Context{Kind: ContextOpaque} }

// OpaqueContextAt is the context of version v of an opaque value: the
// version is the context ID.
func OpaqueContextAt(v ID) Context { return Context{Kind: ContextOpaque, ID: v} }

// OpaqueNewer reports whether the opaque context a names a newer version
// than b: the greater ID (Hi, then Lo).
func OpaqueNewer(a, b Context) bool { return b.ID.Less(a.ID) }

// OpaqueNewest is the context a lookup of an opaque value's newest
// version asks for. No entry is stored in it (its window is not zero), so
// every answer ranks the versions by chunk.Better: the newest first.
func OpaqueNewest() Context { return Context{Kind: ContextOpaque, Window: 1} }

// OpaqueKey is the key of the version-zero value stored under key for the
// opaque model fp (one written before versions).
func OpaqueKey(fp Fingerprint, key []byte) Key { return OpaqueKeyAt(fp, key, ID{}) }

// OpaqueKeyAt is the key of version v of the value stored under key for
// the opaque model fp.
func OpaqueKeyAt(fp Fingerprint, key []byte, v ID) Key {
	return Key{Fingerprint: fp, Content: OpaqueID(fp, key), Context: OpaqueContextAt(v)}
}

// opaqueTokens is the token count of an opaque entry of n key and value
// bytes.
func opaqueTokens(n int) int { return max(2, (n+OpaqueTokenBytes-1)/OpaqueTokenBytes) }

// MaxOpaqueBytes is the most key and value bytes together that an opaque
// entry within lim holds.
func MaxOpaqueBytes(lim Limits) int {
	lim = lim.orDefault()
	return min(lim.MaxTokens*OpaqueTokenBytes, lim.MaxRawBytes/OpaqueTokenBytes*OpaqueTokenBytes)
}

// EncodeOpaque appends the entry of version v of value under key for the
// opaque model fp to dst: lossless when that is smaller than raw, else
// raw.
func EncodeOpaque(dst []byte, fp Fingerprint, key, value []byte, v ID, lim Limits) ([]byte, error) {
	n := len(key) + len(value)
	if m := MaxOpaqueBytes(lim); n > m {
		return dst, fmt.Errorf("%w: %d key and value bytes, the limit is %d", ErrTooLarge, n, m)
	}
	t := opaqueTokens(n)
	tokens := make([]uint32, t)
	tokens[0], tokens[1] = uint32(len(key)), uint32(len(value))
	raw := make([]byte, t*OpaqueTokenBytes)
	copy(raw, key)
	copy(raw[len(key):], value)
	k := OpaqueKeyAt(fp, key, v)
	sh := opaqueShape(t)
	layer := func(int) ([]byte, error) { return raw, nil }
	start := len(dst)
	dst, err := encodeLayers(dst, k, tokens, sh, CodecLossless, layer)
	if err != nil {
		return dst, err
	}
	if len(dst)-start < len(raw) {
		return dst, nil
	}
	return encodeLayers(dst[:start], k, tokens, sh, CodecRaw, layer)
}

// OpaqueLens returns the key and value lengths an opaque entry's header
// declares.
func OpaqueLens(hd *Header) (keyLen, valueLen int) {
	return int(hd.Tokens[0]), int(hd.Tokens[1])
}

// DecodeOpaque returns the value of the opaque entry blob (a new slice),
// which must be stored under key.
func DecodeOpaque(blob, key []byte, lim Limits) ([]byte, error) {
	hd, err := ParseHeader(blob, lim)
	if err != nil {
		return nil, err
	}
	if hd.Key.Context.Kind != ContextOpaque {
		return nil, fmt.Errorf("%w: entry %v is not an opaque value", ErrInvalidEntry, hd.Key)
	}
	raw := make([]byte, hd.Shape.RawBytes())
	if err := DecodeRange(raw, blob, &hd, Range{}, nil); err != nil {
		return nil, err
	}
	kl, vl := OpaqueLens(&hd)
	if !bytes.Equal(raw[:kl], key) || OpaqueID(hd.Key.Fingerprint, key) != hd.Key.Content {
		return nil, fmt.Errorf("%w: %w: opaque entry %v holds another key", ErrCorrupt, ErrNonCanonical, hd.Key)
	}
	return raw[kl : kl+vl : kl+vl], nil
}

// checkOpaque reports whether the header of an opaque entry is in its one
// form: the opaque shape, the fewest tokens that hold its lengths, zero
// tokens after them, and a codec that keeps every byte.
func checkOpaque(hd *Header) error {
	sh := hd.Shape
	if sh.Tokens < 2 || opaqueShape(sh.Tokens) != sh {
		return fmt.Errorf("%w: opaque entry of shape %+v", ErrNonCanonical, sh)
	}
	if hd.Codec.Lossy() {
		return fmt.Errorf("%w: opaque entry in the lossy codec %v", ErrNonCanonical, hd.Codec)
	}
	n := uint64(hd.Tokens[0]) + uint64(hd.Tokens[1])
	if n > uint64(sh.RawBytes()) || opaqueTokens(int(n)) != sh.Tokens {
		return fmt.Errorf("%w: opaque entry of %d key and value bytes in %d tokens", ErrNonCanonical, n, sh.Tokens)
	}
	for _, t := range hd.Tokens[2:] {
		if t != 0 {
			return fmt.Errorf("%w: opaque entry with a non-zero token after its lengths", ErrNonCanonical)
		}
	}
	return nil
}
