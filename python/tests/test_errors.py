"""Misuses of the public API raise a kvmesh.KvmeshError subclass (UsageError)
that says what was expected, never a plain Python error from deep inside."""

import pydoc

import numpy as np
import pytest

import kvmesh
from kvmesh import Context, ID, Key, LookupItem, UsageError
from kvmesh.inject import CacheLayout, InjectChunk, PagedCache, register_cache

FP = kvmesh.ModelSpec("llama", 2, 2, 16, "f32", kvmesh.RopeStyle.NEOX, 10000).fingerprint()
CHUNKS = [[1, 2, 3], [4, 5]]
CTXS, END = kvmesh.prefix_chain(FP, CHUNKS)
CID = kvmesh.content_id(FP, CHUNKS[1])


def raises(match):
    return pytest.raises(UsageError, match=match)


def test_usage_error_is_a_kvmesh_error():
    assert issubclass(UsageError, kvmesh.KvmeshError)
    assert issubclass(UsageError, ValueError) and issubclass(UsageError, TypeError)


def test_prefix_chain_pair_as_want():
    pair = kvmesh.prefix_chain(FP, CHUNKS)
    with raises(r"\(contexts, end\) pair that prefix_chain returns.*contexts\[i\]"):
        InjectChunk(CID, CHUNKS[1], pair, 3, [3, 4])
    with raises("prefix_chain returns"):
        LookupItem(CID, pair)


def test_tokens_as_content():
    with raises(r"content ID \(kvmesh.content_id\(fp, tokens\)\), got its tokens"):
        InjectChunk(CHUNKS[1], CHUNKS[1], CTXS[1], 3, [3, 4])
    with raises("got its tokens"):
        LookupItem(CHUNKS[1], CTXS[1])
    with raises("got its tokens"):
        Key(FP, np.array(CHUNKS[1]), CTXS[1])


def test_slots_and_tokens_lengths():
    with raises("1 slots for 2 tokens"):
        InjectChunk(CID, CHUNKS[1], CTXS[1], 3, [3])
    with raises("ints >= -1"):
        InjectChunk(CID, CHUNKS[1], CTXS[1], 3, [3, -2])
    with raises("non-negative int"):
        InjectChunk(CID, CHUNKS[1], CTXS[1], -1, [3, 4])
    InjectChunk(CID, CHUNKS[1], CTXS[1], 3, [-1, 4])  # -1 skips a token


def test_register_cache_wants_a_paged_cache():
    torch = pytest.importorskip("torch")
    with raises(r"want a kvmesh.inject.PagedCache, got Tensor: allocate a PagedCache"):
        register_cache(None, "127.0.0.1:1", FP, torch.zeros(2, 4, 16, 2, 16))
    with raises("want a kvmesh.inject.PagedCache"):
        register_cache(None, "127.0.0.1:1", FP, np.zeros(4))


def test_capture_before_forward():
    torch = pytest.importorskip("torch")
    from kvmesh.torch import KVCapture

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k_proj, self.v_proj = torch.nn.Linear(4, 32), torch.nn.Linear(4, 32)

    m = torch.nn.Sequential(Attn(), Attn())
    spec = kvmesh.ModelSpec("llama", 2, 2, 16, "f32", kvmesh.RopeStyle.NEOX, 10000)
    with KVCapture(m, spec) as cap:
        pass
    with raises("nothing captured yet: run the model's forward pass"):
        cap.kv()
    with raises("found 2 key and 2 value modules for a 3-layer spec"):
        KVCapture(m, kvmesh.ModelSpec("llama", 3, 2, 16, "f32", kvmesh.RopeStyle.NEOX, 10000))


def test_chunk_entries_strict():
    torch = pytest.importorskip("torch")
    from kvmesh.torch import chunk_entries
    spec = kvmesh.ModelSpec("llama", 2, 2, 16, "f32", kvmesh.RopeStyle.NEOX, 10000)
    tokens = CHUNKS[0] + CHUNKS[1]
    kv = torch.zeros(2, 2, 5, 2, 16)
    with raises("2 bounds and 1 contexts: want one context per chunk"):
        chunk_entries(kv, spec, tokens, [(0, 3), (3, 5)], CTXS[:1])
    with raises(r"bound 1 \(3, 9\)"):
        chunk_entries(kv, spec, tokens, [(0, 3), (3, 9)], CTXS)
    with raises(r"kv: want a tensor \[layers, 2, >= 5, kv_heads, head_dim\]"):
        chunk_entries(kv[:, :, :4], spec, tokens, [(0, 3), (3, 5)], CTXS)
    with raises("prefix_chain returns"):
        chunk_entries(kv, spec, tokens, [(0, 3)], [kvmesh.prefix_chain(FP, CHUNKS)])
    assert len(chunk_entries(kv, spec, tokens, [(0, 3), (3, 5)], CTXS)) == 2


@pytest.mark.parametrize("call, match", [
    (lambda: kvmesh.content_id(FP, "abc"), "want a list of token IDs"),
    (lambda: kvmesh.content_id(FP, [[1, 2], [3, 4]]), "a list of chunks"),
    (lambda: kvmesh.content_id(FP, [1.5, 2]), "flat list of token IDs"),
    (lambda: kvmesh.content_id(FP, [-1]), "fit in uint32"),
    (lambda: kvmesh.content_id(CHUNKS, [1]), "model fingerprint"),
    (lambda: kvmesh.prefix_chain(FP, [1, 2, 3]), "got a list of ints: wrap one chunk"),
    (lambda: kvmesh.window_or_prefix(FP, -1, CHUNKS), "non-negative int"),
    (lambda: kvmesh.next_prefix("x", [1]), "chain ID"),
    (lambda: ID(-1, 0), r"0..2\^64-1"),
    (lambda: ID.parse("xyz"), "32 hex digits"),
    (lambda: Context(7), "ContextKind"),
    (lambda: Context(kvmesh.ContextKind.PREFIX, 0, "id"), "want an ID"),
    (lambda: kvmesh.DType.parse("int3"), "f32, f16 or bf16"),
    (lambda: kvmesh.Codec.parse("zip"), "raw, lossless"),
    (lambda: kvmesh.ModelSpec("llama", 2, 2, 16, "f32", 9, 10000), "NEOX or RopeStyle.GPTJ"),
    (lambda: kvmesh.ModelSpec("llama", 0, 2, 16, "f32", 1, 10000).validate(), "invalid model spec: layers"),
    (lambda: kvmesh.encode(b"bytes"), "want a kvmesh.Entry"),
    (lambda: kvmesh.parse_header(12), r"want an encoded entry \(bytes\)"),
    (lambda: CacheLayout(0, 16, 2, 16), "num_blocks 0: want a positive int"),
    (lambda: CacheLayout(4, 16, 2, 16, order=5), "NHD, HND, BLOCK_NHD or BLOCK_HND"),
    (lambda: PagedCache(2, (4, 16, 2, 16)), "want a kvmesh.inject.CacheLayout"),
    (lambda: kvmesh.Client([]), "no seeds"),
    (lambda: kvmesh.Client([1234]), "host:port strings"),
    (lambda: kvmesh.Client(["a:1"], token="x"), "<id>.<secret>"),
])
def test_wrong_types_and_values(call, match):
    with raises(match):
        call()


def test_client_calls_check_their_arguments(client):
    with raises("want a kvmesh.Key"):
        client.get(CID)
    with raises("want a kvmesh.Key"):
        client.delete((FP, CID))
    with raises("want a list of LookupItems, got one"):
        client.lookup(FP, LookupItem(CID, CTXS[1]))
    with raises(r"item 0: want a kvmesh.LookupItem"):
        client.lookup(FP, [(CID, CTXS[1])])
    with raises("model fingerprint"):
        client.lookup("fp", [])
    with raises("want an Entry or its encoded bytes"):
        client.put([1, 2, 3])
    with raises("want a kvmesh.ModelSpec"):
        client.register_model({"family": "llama"})
    with raises("want a kvmesh.inject.PagedCache"):
        client.register_cache(client.seeds[0], FP, [np.zeros(4)])


def test_help_shows_the_api():
    import importlib
    mods = [kvmesh, kvmesh.keys, kvmesh.entry, kvmesh.client, kvmesh.inject, kvmesh.placement, kvmesh.errors,
            importlib.import_module("kvmesh.hfconfig"), importlib.import_module("kvmesh.safetensors")]
    try:
        import torch  # noqa: F401
        mods += [importlib.import_module(m) for m in ("kvmesh.torch", "kvmesh.torch.llama", "kvmesh.torch.examples",
                                                     "kvmesh.serve", "kvmesh.vllm")]
    except ImportError:
        pass
    for mod in mods:
        assert mod.__all__, mod.__name__
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.__all__ names missing {name}"
    text = pydoc.render_doc(kvmesh, renderer=pydoc.plaintext)
    for name in ("Client", "prefix_chain", "UsageError", "LookupItem"):
        assert name in text
    for name in kvmesh.__all__:
        obj = getattr(kvmesh, name)
        if callable(obj):
            assert obj.__doc__, f"kvmesh.{name} has no docstring"
