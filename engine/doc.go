// Package engine is kvmesh's reference inference engine: an exact float32
// CPU forward pass of the Llama family (Llama, Mistral, Qwen2 with q/k/v
// bias, Qwen3 with q/k norm) that produces chunk KV and consumes it.
//
// It loads Hugging Face checkpoints (config.json and safetensors, one file or
// sharded), writes random-weight models in the same format, keeps a paged KV
// cache in the layout cudakern writes, and runs prefill, decode and greedy
// generation. Chunks are encoded standalone, after a context window, or after
// their whole prefix, and injected at any position through cudakern's
// rotate-and-scatter, after which only the remaining tokens are prefilled.
// Approximate chunks can be repaired by deviation-guided recomputation
// (CacheBlend), which counts the token-layers it computes.
//
// The engine gets KV through the small ChunkSource interface declared here, so
// an in-memory store serves tests and the cluster client serves production;
// engine imports neither client nor node.
package engine
