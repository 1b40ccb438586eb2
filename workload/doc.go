// Package workload runs kvmesh's workload benchmarks: a RAG
// workload whose requests retrieve k passages in reranker-varying orders, a
// multi-turn chat workload whose turns append to a history and quote earlier
// documents, and InferScale's memory-fact workload, all through the
// reference engine against a chunk store (a local cluster through its Go
// client, or an in-memory store in tests).
//
// Every comparison uses one engine and one store. The ways differ only in
// the lookup rule the engine is given:
//   - full prefill: no store;
//   - prefix caching (vLLM, SGLang): EXACT prefix-chain hits for the leading
//     chunks of the prompt, stopping at the first chunk that is not one
//     (PrefixOnly);
//   - kvmesh chunk reuse: EXACT where the chain matches, else the best other
//     encoding of the same content (APPROXIMATE), repaired by
//     deviation-guided recomputation of a fraction r of its tokens.
//
// Generators are seeded and deterministic; runners report time to first
// token, tokens prefilled, hit kinds and fidelity to full prefill.
package workload
