package pagedkv

import "github.com/kvmesh/kvmesh/chunk"

// InjectChunk asks an injector to place one chunk into a cache: its key (with
// the context that would make it exact), its tokens, the absolute position of
// its first token and the cache slot of every token.
type InjectChunk struct {
	Key    chunk.Key
	Tokens []uint32
	Pos    int
	Slots  []int
}

// InjectResult is an injector's answer for one chunk.
type InjectResult struct {
	Match   chunk.Match
	Context chunk.Context // of the entry written (zero on a miss)
}
