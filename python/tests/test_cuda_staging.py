"""Pinned host staging, the fallback of a GPU cache the node cannot write by
CUDA IPC (kvmesh.inject.CUDAPagedCache, kvmesh.torch.gpu.HostStaging),
against real kvmeshd processes built without the cuda tag (they answer a
CUDA IPC registration Unimplemented).

This machine's torch has no CUDA, so the engine's "device" tensors are CPU
tensors and kvmesh.torch.gpu.cuda, the seam of every CUDA call, is replaced
by cudastandin.StandIn: it takes CPU tensors for device tensors, exports
made-up IPC handles, and records page-locking, copy streams and waits. The
copies are torch's copy_ as on a GPU. On a machine with CUDA, the tests marked "cuda"
run the same bodies with real CUDA tensors and the real seam
(scripts/device/gpu-check.sh runs them).

What is asserted is bytes: after an injection through the staging, the
engine's tensors equal what a plain shared-memory PagedCache holds after
the same injection from the same starting contents, so rows the node did
not write (other slots of a partly written block, a MISS chunk's slots)
keep what they held."""

import logging

import pytest

torch = pytest.importorskip("torch")

import kvmesh  # noqa: E402
from kvmesh import KvmeshError, Match, UsageError  # noqa: E402
from kvmesh.inject import (BLOCK_NHD, CUDA_IPC, HOST_STAGING, NHD, ORDERS, CacheLayout, InjectChunk,  # noqa: E402
                           PagedCache, StagedInjector)
from kvmesh.keys import DType, ModelSpec, RopeStyle  # noqa: E402
from kvmesh.torch import cache_tensor, chunk_entries, gpu  # noqa: E402
from cudastandin import StandIn  # noqa: E402

HAVE_CUDA = torch.cuda.is_available()
TORCH_DTYPE = {DType.F16: torch.float16, DType.BF16: torch.bfloat16}


@pytest.fixture
def standin(monkeypatch):
    s = StandIn()
    monkeypatch.setattr(gpu, "cuda", s)
    return s


@pytest.fixture(params=["stand-in", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA"))])
def device(request, monkeypatch):
    """Where the engine's cache lives: CPU tensors behind StandIn, or a real
    GPU behind the real seam."""
    if request.param == "cuda":
        return torch.device("cuda", 0), None
    s = StandIn()
    monkeypatch.setattr(gpu, "cuda", s)
    return torch.device("cpu"), s


def setup_model(cluster, dt):
    """A model with one stored chunk; returns (spec, the stored chunk, a
    chunk nobody stored)."""
    spec = ModelSpec("llama", 2, 2, 16, dt, RopeStyle.NEOX, 10000, salt=f"staging-{dt.name}")
    tokens = list(range(700, 720))
    kv = torch.randn(2, 2, len(tokens), 2, 16, generator=torch.Generator().manual_seed(3))
    (e,) = chunk_entries(kv, spec, tokens, [(0, len(tokens))], [kvmesh.standalone_context()])
    with kvmesh.Client(cluster.seeds) as c:
        c.register_model(spec)
        c.put(e)
    # Slots: a run across a block boundary, a skipped token, rows scattered
    # through partly written blocks (block 16).
    slots = list(range(9, 21)) + [-1] + [33 + 2 * i for i in range(7)]
    hit = InjectChunk(e.key.content, tokens, kvmesh.standalone_context(), 100, slots)
    other = list(range(800, 806))
    miss = InjectChunk(kvmesh.content_id(spec.fingerprint(), other), other, kvmesh.standalone_context(), 300,
                       [50, 51, 52, 53, 54, 55])
    return spec, [hit, miss]


def engine_cache(layout, layers, device):
    """The engine's cache, one tensor per layer, filled with a pattern the
    injection must leave where it writes nothing."""
    g = torch.Generator().manual_seed(11)
    return [torch.randn(layout.shape, generator=g).to(TORCH_DTYPE[layout.dtype]).to(device) for _ in range(layers)]


def bits(t):
    return t.detach().cpu().view(torch.int16).clone()


def reference(client, node, fp, layout, start, chunks):
    """The layers of a plain shared-memory PagedCache that held start, after
    the node injected chunks into it."""
    with PagedCache(len(start), layout) as cache:
        views = [cache_tensor(cache, l) for l in range(len(start))]
        for v, s in zip(views, start):
            v.copy_(s.cpu())
        with client.register_cache(node, fp, cache) as inj:
            res = inj.inject(chunks)
        out = [bits(v) for v in views]
        del views
    return res, out


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dt", [DType.F16, DType.BF16])
def test_staging_writes_what_shm_does(cluster, device, order, dt):
    """staging "always": the engine's tensors get exactly the rows the node
    wrote, each layer before on_layer reports it; the staging is pinned
    while registered and unpinned at close."""
    dev, standin = device
    spec, chunks = setup_model(cluster, dt)
    fp, node = spec.fingerprint(), cluster.nodes[0].grpc
    layout = CacheLayout(4, 16, 2, 16, dt, order)
    start = engine_cache(layout, spec.layers, dev)
    with kvmesh.Client(cluster.seeds) as c:
        want_res, want = reference(c, node, fp, layout, start, chunks)
        assert want_res.matches == [Match.EXACT, Match.MISS]
        tensors = [t.clone() for t in start]
        cache = PagedCache.cuda(tensors, layout, staging="always")
        assert (cache.transport, cache.fallback_reason) == (HOST_STAGING, None)
        seen = []

        def on_layer(l):
            # The engine may read layer l now: it must be there.
            assert torch.equal(bits(tensors[l]), want[l]), f"layer {l} reported before its copy"
            seen.append(l)

        with cache, c.register_cache(node, fp, cache) as inj:
            assert isinstance(inj, StagedInjector)
            if standin:
                assert standin.calls[0][0] == "pin" and standin.calls[0][2] == cache.host_staging().cache.size
            res = inj.inject(chunks, on_layer=on_layer)
        assert res.matches == want_res.matches and res.written_bytes == want_res.written_bytes
        assert seen == list(range(spec.layers))
        for l in range(spec.layers):
            assert torch.equal(bits(tensors[l]), want[l]), f"layer {l}"
            assert not torch.equal(bits(tensors[l]), bits(start[l]))  # something was written
        assert [t.data_ptr() for t in tensors] != [t.data_ptr() for t in start]
        if standin:
            names = [c[0] for c in standin.calls]
            assert names[0] == "pin" and names[-1] == "unpin"
            assert names.count("wait") >= spec.layers and names.count("copy") >= spec.layers


def test_auto_falls_back_when_the_node_cannot_open_ipc(cluster, device, caplog):
    """staging "auto": a kvmeshd without the cuda tag answers the CUDA IPC
    registration Unimplemented; the cache then registers through host
    staging, says why, logs it, and injects the same bytes. "never" raises
    the node's refusal instead."""
    dev, standin = device
    spec, chunks = setup_model(cluster, DType.F16)
    fp, node = spec.fingerprint(), cluster.nodes[0].grpc
    layout = CacheLayout(4, 16, 2, 16, DType.F16, NHD)
    start = engine_cache(layout, spec.layers, dev)
    with kvmesh.Client(cluster.seeds) as c:
        _, want = reference(c, node, fp, layout, start, chunks)
        with PagedCache.cuda([t.clone() for t in start], layout, staging="never") as never:
            assert never.transport == CUDA_IPC
            with pytest.raises(KvmeshError, match="UNIMPLEMENTED") as e:
                c.register_cache(node, fp, never)
            assert e.value.code.name == "UNIMPLEMENTED" and never.transport == CUDA_IPC
        tensors = [t.clone() for t in start]
        with PagedCache.cuda(tensors, layout) as cache:
            assert (cache.transport, cache.fallback_reason) == (CUDA_IPC, None)
            with caplog.at_level(logging.WARNING, logger="kvmesh.inject"):
                inj = c.register_cache(node, fp, cache)
            with inj:
                assert cache.transport == HOST_STAGING
                assert "cannot open its CUDA IPC handles" in cache.fallback_reason
                assert "UNIMPLEMENTED" in cache.fallback_reason
                assert any("host staging" in r.getMessage() for r in caplog.records)
                assert inj.inject(chunks).matches == [Match.EXACT, Match.MISS]
            for l in range(spec.layers):
                assert torch.equal(bits(tensors[l]), want[l])
            # A second registration goes to the staging straight away.
            with c.register_cache(node, fp, cache) as again:
                assert isinstance(again, StagedInjector)


def test_auto_falls_back_when_torch_cannot_export(standin):
    """Tensors torch cannot export (its expandable segments) make "auto"
    choose staging at once; "never" refuses them with UsageError."""
    standin.export_error = RuntimeError("_share_cuda_: expandable segments cannot be shared")
    layout = CacheLayout(2, 16, 2, 16, DType.F16, NHD)
    tensors = [torch.zeros(layout.shape, dtype=torch.float16)]
    with pytest.raises(UsageError, match="cannot export it by CUDA IPC: _share_cuda_"):
        PagedCache.cuda(tensors, layout, staging="never")
    cache = PagedCache.cuda(tensors, layout)
    assert cache.transport == HOST_STAGING and "expandable segments" in cache.fallback_reason
    assert standin.calls == []  # no staging until it is registered


def test_failed_copy_raises(cluster, standin):
    """A copy that fails raises KvmeshError, and the layer is not reported."""
    spec, chunks = setup_model(cluster, DType.F16)
    layout = CacheLayout(4, 16, 2, 16, DType.F16, NHD)
    tensors = engine_cache(layout, spec.layers, "cpu")
    standin.wait_error = RuntimeError("CUDA error: an illegal memory access was encountered")
    layers = []
    with kvmesh.Client(cluster.seeds) as c, PagedCache.cuda(tensors, layout, staging="always") as cache:
        with c.register_cache(cluster.nodes[0].grpc, spec.fingerprint(), cache) as inj:
            with pytest.raises(KvmeshError, match="illegal memory access"):
                inj.inject(chunks, on_layer=layers.append)
    assert layers == []


def test_one_staged_registration_at_a_time(cluster, standin):
    """The staging is one shared-memory file: a second registration while
    one holds it is refused, and allowed once that one is closed; an
    injector whose cache was closed refuses to inject."""
    spec, _ = setup_model(cluster, DType.F16)
    layout = CacheLayout(4, 16, 2, 16, DType.F16, NHD)
    node = cluster.nodes[0].grpc
    with kvmesh.Client(cluster.seeds) as c, \
            PagedCache.cuda(engine_cache(layout, spec.layers, "cpu"), layout, staging="always") as cache:
        with c.register_cache(node, spec.fingerprint(), cache):
            with pytest.raises(UsageError, match="already"):
                c.register_cache(node, spec.fingerprint(), cache)
        with c.register_cache(node, spec.fingerprint(), cache) as inj:
            assert inj.inject([]).matches == []
            cache.close()  # before its injector: the node still maps the old staging
            with pytest.raises(UsageError, match="closed"):
                inj.inject([])


def test_slot_runs_and_rows():
    """slot_runs merges consecutive slots (-1 and repeats dropped); copy_rows
    copies those rows alone (a run across a block boundary, a whole block,
    a single row), in every order."""
    assert gpu.slot_runs([5, 3, 4, -1, 4, 9, 10, 12]) == [(3, 6), (9, 11), (12, 13)]
    assert gpu.slot_runs([-1, -1]) == [] and gpu.slot_runs([]) == []
    rows = [14, 15] + list(range(16, 32)) + [32, 33, 50]
    runs = gpu.slot_runs(rows)
    for order in ORDERS:
        lay = CacheLayout(4, 16, 3, 8, DType.F16, order)
        src, dst = torch.randn(lay.shape).half(), torch.randn(lay.shape).half()
        want = dst.clone()
        w, s = lay.canonical(want), lay.canonical(src)  # views: writing w writes want
        for slot in rows:
            w[:, slot // 16, slot % 16] = s[:, slot // 16, slot % 16]
        gpu.copy_rows(dst, src, runs, order)
        assert torch.equal(dst, want), order
    # vLLM's FlashInfer backend with its HND cache layout: the BLOCK_NHD
    # shape over memory in BLOCK_HND order (a strided tensor).
    lay = CacheLayout(4, 16, 3, 8, DType.F16, BLOCK_NHD)
    src = torch.randn(lay.shape).half()
    dst = torch.randn(4, 2, 3, 16, 8).half().permute(0, 1, 3, 2, 4)
    want = dst.clone()
    for slot in rows:
        want[slot // 16, :, slot % 16] = src[slot // 16, :, slot % 16]
    gpu.copy_rows(dst, src, runs, BLOCK_NHD)
    assert torch.equal(dst, want)
    with pytest.raises(UsageError, match="order"):
        gpu.copy_rows(dst, src, runs, 7)


def test_unpinned_staging_still_copies(standin, caplog):
    """Where page-locking fails (a memlock limit, a torch without the
    binding) the staging says so and copies synchronously, as exactly."""
    def refuse(ptr, nbytes):
        raise KvmeshError("cudaHostRegister: CUDA error 2")
    standin.pin = refuse
    lay = CacheLayout(2, 16, 2, 8, DType.F16, NHD)
    dst = [torch.zeros(lay.shape, dtype=torch.float16)]
    with caplog.at_level(logging.WARNING, logger="kvmesh.gpu"):
        st = gpu.HostStaging(dst, lay)
    try:
        assert not st.pinned and any("not page-locked" in r.getMessage() for r in caplog.records)
        st.host[0].copy_(torch.randn(lay.shape).half())
        st.copy(0, gpu.slot_runs([3, 4, 20]))
        st.wait()
        want = torch.zeros(lay.shape, dtype=torch.float16)
        want[:, 0, 3:5], want[:, 1, 4] = st.host[0][:, 0, 3:5], st.host[0][:, 1, 4]
        assert torch.equal(dst[0], want)
    finally:
        st.close()
    assert ("unpin", st._base) not in standin.calls
    with pytest.raises(UsageError, match="closed"):
        st.copy(0, [(0, 1)])


def test_failed_pin_clears_the_runtime_error(monkeypatch):
    """A cudaHostRegister that fails is a KvmeshError and resets the CUDA
    runtime's last error, which torch's next kernel launch check would
    otherwise report as its own (the real seam over a stand-in cudart)."""
    class Cudart:
        def cudaHostRegister(self, ptr, nbytes, flags):
            return 801  # cudaErrorNotSupported

        def cudaHostUnregister(self, ptr):
            return 1

    cleared = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    monkeypatch.setattr(gpu, "_clear_last_error", lambda: cleared.append(True))
    with pytest.raises(KvmeshError, match="CUDA error 801"):
        gpu.CUDA().pin(4096, 4096)
    with pytest.raises(KvmeshError, match="CUDA error 1"):
        gpu.CUDA().unpin(4096)
    assert cleared == [True, True]


def test_clear_last_error(caplog):
    """With torch's CUDA runtime loaded (the GPU run) the reset finds
    cudaGetLastError; without one it is a warning, not an error."""
    if HAVE_CUDA:
        torch.zeros(1, device="cuda")  # the runtime is loaded and initialised
    with caplog.at_level(logging.WARNING, logger="kvmesh.gpu"):
        gpu._clear_last_error()
    warned = any("last error" in r.getMessage() for r in caplog.records)
    assert warned != HAVE_CUDA
