// Package pagedkv describes an inference engine's paged KV cache as the
// engine, the node that injects into it and the client that registers it all
// see it: the byte geometry of one layer (CacheLayout: vLLM's FlashAttention
// layout NHD or its HND variant, or FlashInfer's BlockNHD and BlockHND with
// K and V inside each block; dtype, fp8 scales) and what an injection asks
// and answers per chunk (InjectChunk, InjectResult).
//
// It holds types and their arithmetic only, no kernels, so that a client
// can name a cache without linking the engine or cudakern (which read and
// write caches of this layout). It imports only chunk.
package pagedkv
