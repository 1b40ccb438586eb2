// Package chunk defines what kvmesh stores and how it is named: the model
// spec and its fingerprint, the 128-bit content and context IDs of a chunk of
// tokens, the entry format that carries a chunk's pre-RoPE K and V tensors,
// the codecs that compress them, and the float conversions they need. It also
// holds the shared vocabulary of lookups: how a stored encoding fits a wanted
// chunk (Match) and which stored encoding is best (Better).
//
// It imports nothing else of kvmesh; every other package builds on it. The
// key derivation is specified byte for byte in docs/KEYS.md so that clients
// in other languages compute the same keys.
//
// Stored entries stay readable as the codecs improve: the header's Version
// names the header and layer table, and a codec that changes how it lays
// out a layer marks the new layout in the layer's own bytes (the lossless
// codec's f16 layers start with a layout byte no older layer starts with;
// codec_lossless.go), so decoders read every layout ever written.
package chunk
