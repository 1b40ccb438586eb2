// Package engine is kvmesh's reference inference engine: an exact float32
// CPU forward pass of the Llama family (Llama, Mistral, Qwen2 with q/k/v
// bias, Qwen3 with q/k norm) that produces chunk KV and consumes it.
//
// It loads Hugging Face checkpoints (config.json and safetensors, one file or
// sharded), writes random-weight models in the same format, keeps a paged KV
// cache in any layout cudakern writes (a pagedkv.Order, float32), and runs
// prefill, decode and greedy generation. Chunks are encoded standalone,
// after a context window, after their whole prefix, or all at once from one
// prefill of a prompt (EncodePrompt, the write-back path), with K captured
// before RoPE and after q/k norm.
//
// Run places a prompt's chunks at any position: it asks a ChunkSource (an
// in-memory MemStore here, the cluster client in production) for the best
// encoding of each chunk, injects the hits through cudakern's fused
// rotate-and-scatter and prefills only the rest. RunInjected does the same
// with a CacheInjector that writes the cache itself (the node-side path,
// over memory exposed by CacheMemory); with a LayeredInjector (one that
// announces its plan and each layer written) the forward pass starts at
// the plan and computes layer l as soon as layer l is in the cache, with
// the same result bit for bit. APPROXIMATE chunks can be repaired by
// deviation-guided recomputation (CacheBlend): every chunk token is
// computed up to a check layer, the tokens whose keys deviate most from the
// injected ones (or that the question attends to most, or both: Selection)
// are kept, and only those are recomputed in later layers; a guardrail
// (Request.FallbackBound) recomputes whole any chunk whose key deviation at
// the check layer exceeds a bound. The forward pass counts the token-layers
// it computes.
//
// Linear layers and attention use AVX2+FMA assembly kernels on amd64 (pure
// Go elsewhere, or with the purego build tag) on a fixed worker pool.
// Attention reads each key and value row once for the query heads that
// share it, two at a time, and does the softmax row in eight lanes, as the
// MLP does its SiLU gate and RMSNorm its rows; a
// token's result does not depend on the batch it was computed in, so
// injected KV followed by a prefill of the rest gives the logits of a full
// prefill to float32 rounding of RoPE angles.
//
// The TTFT benchmark harness over the engine is internal/enginebench
// (cmd/kvmesh-engine-bench); BenchModel is the model shape it and the
// engine's own benchmarks use.
//
// The engine imports neither client nor node.
package engine
