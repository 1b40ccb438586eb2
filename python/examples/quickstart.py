import os
import numpy as np
import kvmesh
from kvmesh import Client, Entry, Key, LookupItem, ModelSpec, Range
from kvmesh.keys import DType, RopeStyle

spec = ModelSpec("llama", layers=2, kv_heads=2, head_dim=8, dtype=DType.F16,
                 rope_style=RopeStyle.NEOX, rope_theta=10000, tokenizer_id="example")
with Client(os.environ["KVMESH_ADDR"].split(",")) as c:
    print(c.cluster_info())                  # members, leader, R, W, codec
    fp = c.register_model(spec)              # cluster-wide; returns spec.fingerprint()

    # A prompt cut into chunks; each chunk's EXACT context is its prefix chain.
    chunks = [[1, 2, 3, 4], [5, 6, 7, 8]]
    contexts, _ = kvmesh.prefix_chain(fp, chunks)
    kv = np.random.default_rng(0).standard_normal((2, 2, 4, 2, 8)).astype(np.float16)
    e = Entry.from_kv(Key(fp, kvmesh.content_id(fp, chunks[1]), contexts[1]), chunks[1], kv)
    print(c.put(e, codec="lossless"))        # stored on the chunk's replicas

    items = [LookupItem(kvmesh.content_id(fp, t), x) for t, x in zip(chunks, contexts)]
    print([r.match for r in c.lookup(fp, items)])          # ['MISS', 'EXACT']
    got = c.get_entry(e.key)                 # whole entry, every checksum verified
    assert np.array_equal(got.kv, kv)
    part = c.get_range(e.key, Range(layer_lo=1, layer_hi=2, head_lo=1, head_hi=2))
    assert np.array_equal(part.kv, kv[1:2, :, :, 1:2])
    c.delete(e.key)
