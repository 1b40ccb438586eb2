import os
import kvmesh
from kvmesh.inject import CacheLayout, InjectChunk, PagedCache
from kvmesh.torch import KVCapture, cache_tensor, chunk_entries
from kvmesh.torch.examples import TinyLlama

model = TinyLlama(seed=7)          # torch modules with HF names: layers[i].self_attn.k_proj, ...
spec, fp = model.spec, model.spec.fingerprint()
tokens = list(range(100, 164)) + [7, 8, 9]          # a 64-token chunk, then a question
pos = list(range(len(tokens)))                       # positions; here slot i holds position i
new_cache = lambda: PagedCache(spec.layers, CacheLayout(8, 16, spec.kv_heads, spec.head_dim, spec.dtype))
addrs = os.environ["KVMESH_ADDR"].split(",")
with kvmesh.Client(addrs) as client, new_cache() as a, new_cache() as b:
    client.register_model(spec)
    layers = [cache_tensor(a, l) for l in range(spec.layers)]       # torch views of the paged cache
    with KVCapture(model, spec) as cap:                             # hooks *.k_proj and *.v_proj
        full = model(tokens, pos, layers, pos, pos)                 # a full prefill: logits [T, vocab]
    ctxs, _ = kvmesh.prefix_chain(fp, [tokens[:64]])                # the chunk's EXACT context
    for e in chunk_entries(cap.kv(), spec, tokens, [(0, 64)], ctxs):
        client.put(e)
    layers = [cache_tensor(b, l) for l in range(spec.layers)]       # a fresh cache for the next prompt
    with client.register_cache(addrs[0], fp, b) as inj:             # the node on this machine fills it
        res = inj.inject([InjectChunk(kvmesh.content_id(fp, tokens[:64]), tokens[:64], ctxs[0], 0, pos[:64])])
    logits = model(tokens[64:], pos[64:], layers, pos[64:], pos)    # compute only the question
    print(res.matches, float((logits - full[64:]).abs().max()))     # ['EXACT'] and about 1e-6
    del layers
