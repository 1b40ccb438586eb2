"""PyTorch path: capture pre-RoPE K and V from a small Llama, store chunks
with their contexts, let the local node inject them into a paged cache in
shared memory, and continue the model from it. EXACT hits must give the
logits of a full prefill; APPROXIMATE and MISS are reported as such."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvmesh  # noqa: E402
from kvmesh import Match  # noqa: E402
from kvmesh.inject import CacheLayout, InjectChunk, PagedCache  # noqa: E402
from kvmesh.torch import KVCapture, cache_tensor, chunk_entries  # noqa: E402
from kvmesh.torch.examples import TinyLlama  # noqa: E402

CHUNK, SUFFIX, BLOCK = 64, 8, 16
TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return TinyLlama(seed=7)


@pytest.fixture(scope="module")
def setup(cluster, model):
    with kvmesh.Client(cluster.seeds) as c:
        c.register_model(model.spec)
    return model


def new_cache(model, tokens):
    blocks = -(-tokens // BLOCK)
    s = model.spec
    return PagedCache(s.layers, CacheLayout(blocks, BLOCK, s.kv_heads, s.head_dim, s.dtype))


def prompt(offset, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 512, offset + CHUNK + SUFFIX).tolist()


def run_full(model, tokens, capture=False):
    """A full prefill into a fresh cache; returns logits (and the captured
    pre-RoPE KV)."""
    n = len(tokens)
    with new_cache(model, n) as cache:
        caches = [cache_tensor(cache, l) for l in range(model.spec.layers)]
        pos = list(range(n))
        if capture:
            with KVCapture(model, model.spec) as cap:
                logits = model(tokens, pos, caches, pos, pos)
            out = logits, cap.kv()
        else:
            out = model(tokens, pos, caches, pos, pos)
        del caches
    return out


def run_injected(model, client, node, tokens, offset, want, content=None):
    """Prefills tokens[:offset], has the node inject the chunk at offset,
    then computes the suffix from the cache. Returns (suffix logits, the
    inject result, the chunk's K slots after injection)."""
    fp = model.spec.fingerprint()
    n = len(tokens)
    chunk = tokens[offset:offset + CHUNK]
    with new_cache(model, n) as cache:
        caches = [cache_tensor(cache, l) for l in range(model.spec.layers)]
        seq = list(range(n))
        if offset:
            model(tokens[:offset], seq[:offset], caches, seq[:offset], seq[:offset])
        layers, plans = [], []
        with client.register_cache(node, fp, cache) as inj:
            res = inj.inject([InjectChunk(content or kvmesh.content_id(fp, chunk), chunk, want, offset,
                                          seq[offset:offset + CHUNK])], on_layer=layers.append, on_plan=plans.append)
        # The plan comes before any layer and agrees with the results.
        assert plans == [res.matches]
        assert layers == (list(range(model.spec.layers)) if res.matches[0] != Match.MISS else [])
        written = caches[0].view(2, -1, model.spec.kv_heads, model.spec.head_dim)[0, offset:offset + CHUNK].clone()
        logits = model(tokens[offset + CHUNK:], seq[offset + CHUNK:], caches, seq[offset + CHUNK:], seq)
        del caches
    return logits, res, written


@pytest.mark.parametrize("offset", [0, 300, 1500])
def test_exact_hit_equals_prefill(setup, cluster, offset):
    model = setup
    fp = model.spec.fingerprint()
    tokens = prompt(offset, offset)
    ref, kv = run_full(model, tokens, capture=True)
    # The prompt as chunks: its prefix (one chunk, if any), the chunk, the
    # suffix. The chunk's context is the prefix chain up to it: EXACT.
    cuts = ([(0, offset)] if offset else []) + [(offset, offset + CHUNK)]
    ctxs, _ = kvmesh.prefix_chain(fp, [tokens[a:b] for a, b in cuts])
    with kvmesh.Client(cluster.seeds) as c:
        (e,) = chunk_entries(kv, model.spec, tokens, cuts[-1:], ctxs[-1:])
        c.put(e)
        got, res, _ = run_injected(model, c, cluster.nodes[0].grpc, tokens, offset, ctxs[-1])
    assert res.matches == [Match.EXACT]
    assert (res.keys[0].content, res.keys[0].context) == (e.key.content, e.key.context)
    # The node's stage timers come through the client.
    assert res.timings["fetch_ns"] > 0 and res.timings["scatter_ns"] > 0, res.timings
    diff = (got - ref[offset + CHUNK:]).abs().max().item()
    print(f"offset {offset}: max |logit diff| {diff:.3g}")
    assert diff <= TOL


def test_approximate_and_miss(setup, cluster):
    model = setup
    fp = model.spec.fingerprint()
    offset = 200
    tokens = prompt(offset, 99)
    chunk = tokens[offset:offset + CHUNK]
    ref = run_full(model, tokens)
    # The chunk encoded alone (standalone) is another encoding of the same
    # content: injected after a different prefix it is APPROXIMATE.
    _, kv_alone = run_full(model, chunk + [0] * SUFFIX, capture=True)
    (e,) = chunk_entries(kv_alone, model.spec, chunk, [(0, CHUNK)], [kvmesh.standalone_context()])
    want = kvmesh.prefix_chain(fp, [tokens[:offset], chunk])[0][1]
    with kvmesh.Client(cluster.seeds) as c:
        c.put(e)
        got, res, written = run_injected(model, c, cluster.nodes[1].grpc, tokens, offset, want)
        assert res.matches == [Match.APPROXIMATE] and res.keys[0].context == kvmesh.standalone_context()
        assert written.abs().sum() > 0
        # Approximate KV changes the answer: the EXACT check is not vacuous.
        assert (got - ref[offset + CHUNK:]).abs().max().item() > 10 * TOL
        # A chunk nothing stored: MISS, and its slots are left alone.
        other = [t ^ 1 for t in chunk]
        _, res, written = run_injected(model, c, cluster.nodes[2].grpc, tokens[:offset] + other + tokens[-SUFFIX:],
                                       offset, want)
        assert res.matches == [Match.MISS] and res.keys == [None]
        assert written.abs().sum() == 0


def test_capture_matches_pre_rope_keys(setup):
    """The capture holds k_proj's output: rotating it gives the cache's K."""
    model = setup
    tokens = prompt(0, 5)[:40]
    n = len(tokens)
    with new_cache(model, n) as cache:
        caches = [cache_tensor(cache, l) for l in range(model.spec.layers)]
        pos = list(range(n))
        with KVCapture(model, model.spec) as cap:
            model(tokens, pos, caches, pos, pos)
        kv = cap.kv()
        from kvmesh.torch.examples import rotate
        k_cache = caches[1].view(2, -1, model.spec.kv_heads, model.spec.head_dim)[0, :n]
        assert torch.equal(rotate(kv[1, 0], model.cos[:n], model.sin[:n]), k_cache)
        assert torch.equal(kv[1, 1], caches[1].view(2, -1, model.spec.kv_heads, model.spec.head_dim)[1, :n])
        del caches


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_layouts_and_dtypes(cluster, dtype):
    """The node writes the same values into a cache of every order of a
    16-bit dtype; V lands unrotated, exactly as stored. A BLOCK_NHD layer is
    a tensor of FlashInfer's shape (vLLM's FlashInfer and Triton backends:
    [num_blocks, 2, block_size, kv_heads, head_dim]) and a BLOCK_HND layer
    FlashInfer's HND one: per (slot, head) they hold what the NHD cache
    holds."""
    from kvmesh.inject import BLOCK_HND, BLOCK_NHD, HND, NHD, ORDERS
    from kvmesh.keys import DType, ModelSpec, RopeStyle
    dt = DType.parse(dtype)
    spec = ModelSpec("llama", 2, 2, 16, dt, RopeStyle.NEOX, 10000, salt=f"layouts-{dtype}")
    fp = spec.fingerprint()
    tokens = list(range(900, 920))
    kv = torch.randn(2, 2, len(tokens), 2, 16)
    from kvmesh.torch import chunk_entries
    (e,) = chunk_entries(kv, spec, tokens, [(0, len(tokens))], [kvmesh.standalone_context()])
    nb, bs = 5, 16
    slots = [5 + 3 * i for i in range(len(tokens))]  # scattered slots, across blocks
    b, o = torch.tensor(slots) // bs, torch.tensor(slots) % bs
    # (kv, slots' blocks, their offsets) -> [tokens, heads, dim], indexed as
    # each engine indexes its own tensor.
    index = {
        NHD: lambda t, k: t[k, b, o],
        HND: lambda t, k: t[k, b, :, o],
        BLOCK_NHD: lambda t, k: t[b, k, o],
        BLOCK_HND: lambda t, k: t[b, k, :, o],
    }
    shapes = {NHD: (2, nb, bs, 2, 16), HND: (2, nb, 2, bs, 16), BLOCK_NHD: (nb, 2, bs, 2, 16),
              BLOCK_HND: (nb, 2, 2, bs, 16)}
    got = {}
    with kvmesh.Client(cluster.seeds) as c:
        c.register_model(spec)
        c.put(e)
        for order in ORDERS:
            lay = CacheLayout(nb, bs, 2, 16, dt, order)
            with PagedCache(2, lay) as cache:
                with c.register_cache(cluster.nodes[0].grpc, fp, cache) as inj:
                    res = inj.inject([InjectChunk(e.key.content, tokens, kvmesh.standalone_context(), 100, slots)])
                assert res.matches == [Match.EXACT]
                t = cache_tensor(cache, 1)
                assert tuple(t.shape) == shapes[order] == lay.shape
                got[order] = torch.stack([index[order](t, k) for k in range(2)]).float().clone()
                # canonical() is the same view whatever the order.
                assert torch.equal(lay.canonical(t)[:, b, o].float(), got[order])
                # Every byte outside the named slots is still zero.
                rest = lay.canonical(t).clone()
                rest[:, b, o] = 0
                assert not rest.float().any()
                del t, rest
    for order in ORDERS:
        assert torch.equal(got[order], got[NHD]), order
    want_v = kv[1, 1].to({DType.F16: torch.float16, DType.BF16: torch.bfloat16}[dt]).float()
    assert torch.equal(got[NHD][1], want_v)
    assert not torch.equal(got[NHD][0], kv[1, 0])  # K is rotated to position 100


def test_registration_refusals(setup, cluster, tmp_path):
    """The node maps only shared memory its caller hands over, once: a
    second registration of a registered cache, a file on disk and a
    made-up handle are each refused, with the same answer."""
    import os
    import subprocess
    import grpc
    from kvmesh._pb import inject_pb2, inject_pb2_grpc
    from kvmesh.client import _pid
    from kvmesh.inject import send_cache_file
    fp = setup.spec.fingerprint()
    node = cluster.nodes[0].grpc
    with kvmesh.Client(cluster.seeds) as c, new_cache(setup, 64) as cache:
        stub = inject_pb2_grpc.InjectorStub(c._channel(node))
        sock = stub.CacheSocket(inject_pb2.CacheSocketRequest()).address

        def register(handle):
            req = inject_pb2.RegisterCacheRequest(
                fingerprint=_pid(fp), layers=cache.layers, layouts=[cache.layout.proto()],
                memory_kind=inject_pb2.MEMORY_KIND_SHM, memory_handle=handle, offsets=cache.offsets)
            return stub.RegisterCache(req)

        def attempt(fd=None, handle=None):
            """Hands fd over (unless a handle is given) and registers it:
            the answer of the step that refused."""
            try:
                if handle is None:
                    handle = send_cache_file(sock, fd)
                register(handle)
            except kvmesh.PermissionDenied as e:  # the cache socket's refusal
                return "socket", str(e).rsplit(": ", 1)[-1]
            except grpc.RpcError as e:
                return e.code(), e.details()
            return "registered", None

        with c.register_cache(node, fp, cache):
            with pytest.raises(kvmesh.PermissionDenied):
                c.register_cache(node, fp, cache)  # the same file again
            answers = {}
            fd = os.open(f"/proc/self/fd/{cache.fileno()}", os.O_RDWR)  # opened anew
            try:
                answers["reopened"] = attempt(fd)
            finally:
                os.close(fd)
            disk = tmp_path / "cache"
            disk.write_bytes(bytes(cache.size))
            fs = subprocess.run(["stat", "-f", "-c", "%T", str(disk)], capture_output=True, text=True).stdout.strip()
            if fs not in ("tmpfs", "hugetlbfs"):  # else it is shared memory, and mapped
                with open(disk, "r+b") as f:
                    answers["disk file"] = attempt(f.fileno())
            answers["made-up handle"] = attempt(handle=bytes(32))
            for what, (step, msg) in answers.items():
                assert step in ("socket", grpc.StatusCode.PERMISSION_DENIED), (what, step, msg)
                assert msg == "shared memory refused", (what, msg)


def test_tiny_llama_checkpoint_loads_in_llama_model(model, tmp_path):
    """save_pretrained writes TinyLlama as an HF checkpoint: LlamaModel runs
    the same model."""
    from kvmesh.torch import LlamaModel
    from kvmesh.torch.examples import save_pretrained
    save_pretrained(model, tmp_path)
    lm = LlamaModel.from_pretrained(tmp_path)
    tokens = prompt(0, 3)[:50]
    ref = run_full(model, tokens)[-1]
    assert (lm.prefill(tokens) - ref).abs().max().item() < 1e-4
