"""kvmesh.vllm.KvmeshConnector driven through vLLM's call sequence (vLLM
itself cannot be installed here: no PyPI, and its CPU build needs torch
2.x): the scheduler side (get_num_new_matched_tokens,
update_state_after_alloc, build_connector_meta, request_finished) and the
worker side (register_kv_caches, bind_connector_metadata, start_load_kv,
wait_for_layer_load and save_kv_layer per attention layer, wait_for_save,
get_finished, get_block_ids_with_load_errors, clear_connector_metadata),
with the objects those calls take shaped as vLLM's, against a torch paged
cache of vLLM FlashAttention's shape [2, num_blocks, block_size, kv_heads,
head_dim] per layer and of the FlashInfer and Triton backends' [num_blocks,
2, block_size, kv_heads, head_dim] (also over memory with block_size and
kv_heads swapped: vLLM's HND cache layout), the model being
kvmesh.torch.LlamaModel on the trained recall model.

Where vLLM's cache lives (the setup fixture runs every test in each):
- "cpu": CPU tensors and the real CUDA seam: the connector's host staging
  of a cache in host memory.
- "gpu-staging": the tensors stand for CUDA tensors (cudastandin.StandIn
  as kvmesh.torch.gpu.cuda): the connector registers them by CUDA IPC, the
  node (kvmeshd without the cuda tag) answers Unimplemented, and "auto"
  falls back to pinned host staging.
- "gpu-ipc": the same, and the node is made to write the memory the IPC
  handles name: vLLM's layers are views of one shared-memory allocation,
  and IPCNode registers a CUDA IPC request naming it as that memory, with
  the request's own offsets and layout. So the node writes hits straight
  into vLLM's tensors, as by CUDA IPC, and loads come out right only if
  the handles and offsets the connector sent are.
On a machine with CUDA, test_cuda_cache_loads registers real CUDA tensors
with the plain kvmeshd (the fallback; scripts/device/gpu-check.sh runs
it)."""

import json
import logging
import math
import types

import pytest

torch = pytest.importorskip("torch")

import kvmesh  # noqa: E402
from conftest import ROOT  # noqa: E402
from cudastandin import StandIn, storage_ptr  # noqa: E402
from kvmesh._pb import inject_pb2, inject_pb2_grpc  # noqa: E402
from kvmesh.inject import (BLOCK_HND, BLOCK_NHD, CUDA_IPC, HND, HOST_STAGING, NHD, CacheLayout,  # noqa: E402
                           PagedCache, send_cache_file)
from kvmesh.torch import LlamaModel, gpu  # noqa: E402
from kvmesh.torch.llama import Plan  # noqa: E402
from kvmesh.vllm import HAVE_VLLM, KvmeshConnector, KVConnectorRole, VLLM_COMMIT  # noqa: E402

BLOCK, CHUNK, NUM_BLOCKS = 16, 64, 64
HF = json.loads((ROOT / "train" / "recall" / "config.json").read_text())


def vllm_config(addrs, tokenizer, **extra):
    ns = types.SimpleNamespace
    return ns(kv_transfer_config=ns(kv_connector="KvmeshConnector", kv_connector_module_path="kvmesh.vllm",
                                    kv_role="kv_both",
                                    kv_connector_extra_config={"addrs": ",".join(addrs), "chunk_tokens": CHUNK,
                                                               "tokenizer_id": tokenizer, **extra}),
              cache_config=ns(block_size=BLOCK, cache_dtype="auto"),
              model_config=ns(hf_config=HF, dtype=torch.float32, model="train/recall", revision=None))


class Blocks:
    """vLLM's KVCacheBlocks: get_block_ids() is one list per cache group."""

    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


# vLLM's backends: (the layer's memory shape for kv_heads H and head_dim
# D, whether the tensor vLLM gives swaps block_size and kv_heads back,
# kvmesh's order of that memory).
BACKENDS = {
    "flash_attn": (lambda H, D: (2, NUM_BLOCKS, BLOCK, H, D), False, NHD),
    "flashinfer": (lambda H, D: (NUM_BLOCKS, 2, BLOCK, H, D), False, BLOCK_NHD),
    "flash_attn_hnd": (lambda H, D: (2, NUM_BLOCKS, H, BLOCK, D), True, HND),
    "flashinfer_hnd": (lambda H, D: (NUM_BLOCKS, 2, H, BLOCK, D), True, BLOCK_HND),
}


def zeros(layers, shape):
    """vLLM's allocation: a zeroed tensor per layer."""
    return [torch.zeros(shape) for _ in range(layers)]


class Runner:
    """The model runner's side of one step, in vLLM's order. vllm holds the
    layers as the attention backend shapes them (FlashAttention's, or
    FlashInfer's with K and V inside each block; over memory allocated by
    alloc(layers, shape) in the backend's memory order); caches are the
    same memory as [2, num_blocks, block_size, kv_heads, head_dim] views,
    which the model reads and writes."""

    def __init__(self, model, worker, backend, alloc=zeros):
        self.model, self.worker = model, worker
        self.names = [f"model.layers.{l}.self_attn.attn" for l in range(model.num_layers)]
        shape, swapped, self.order = BACKENDS[backend]
        self.memory = alloc(len(self.names), shape(model.config.num_kv_heads, model.config.head_dim))
        self.vllm = [m.transpose(2, 3) if swapped else m for m in self.memory]
        self.caches = self.vllm if self.vllm[0].shape[0] == 2 else [t.transpose(0, 1) for t in self.vllm]
        worker.register_kv_caches(dict(zip(self.names, self.vllm)))

    def step(self, meta, tokens, blocks, computed, capture=True):
        slots = [blocks[t // BLOCK] * BLOCK + t % BLOCK for t in range(len(tokens))]
        w = self.worker
        md = types.SimpleNamespace(slot_mapping=torch.as_tensor(slots[computed:]))
        fc = types.SimpleNamespace(attn_metadata={n: md for n in self.names}, no_compile_layers={})
        w.bind_connector_metadata(meta)
        w.start_load_kv(fc)

        def saved(l, k, v, _slots):
            if capture:
                w.record_pre_rope_key(l, k)  # what capture_hooks' pre-hook on rotary_emb records
            w.save_kv_layer(self.names[l], self.vllm[l], md)

        plan = Plan(active=list(range(computed, len(tokens))), wait=lambda l: w.wait_for_layer_load(self.names[l]),
                    saved=saved)
        out = self.model.run(tokens, list(range(len(tokens))), self.caches, slots, plan)
        w.wait_for_save()
        finished = w.get_finished(set())
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        return out.logits, slots, finished, errors


def schedule(sched, req_id, tokens, blocks, local_computed=0):
    """The scheduler's calls for a new request: matched tokens, allocation,
    metadata."""
    req = types.SimpleNamespace(request_id=req_id, prompt_token_ids=tokens, all_token_ids=tokens)
    ext, async_ = sched.get_num_new_matched_tokens(req, local_computed)
    assert async_ is False
    sched.update_state_after_alloc(req, Blocks(blocks), ext)
    new = types.SimpleNamespace(req_id=req_id, prompt_token_ids=tokens, block_ids=(list(blocks),),
                                num_computed_tokens=local_computed + ext, mm_features=[])
    out = types.SimpleNamespace(scheduled_new_reqs=[new], num_scheduled_tokens={req_id: len(tokens) - local_computed - ext},
                                finished_req_ids=set(), scheduled_cached_reqs=types.SimpleNamespace(req_ids=[]))
    return req, ext, sched.build_connector_meta(out)


class IPCNode:
    """Records the RegisterCache requests the connector sends (the node's
    InjectorStub, wrapped), the IDs of the caches registered and those
    unregistered. Where memory names the storage address an IPC
    handle of the stand-in exports (cudastandin.StandIn), that request is
    registered as the shared-memory PagedCache there instead, with the
    request's offsets and layout: the real node then writes what the
    handles name, as a kvmeshd with the cuda tag would."""

    def __init__(self, standin, monkeypatch):
        self.standin, self.requests, self.memory = standin, [], {}
        self.registered, self.unregistered = [], []
        real, node = inject_pb2_grpc.InjectorStub, self

        class Stub:
            def __init__(self, channel):
                self._real = real(channel)

            def __getattr__(self, name):
                return getattr(self._real, name)

            def RegisterCache(self, req, **kw):
                node.requests.append(inject_pb2.RegisterCacheRequest.FromString(req.SerializeToString()))
                names = {node.standin.handles.get(h) for h in req.ipc_handles}
                if req.memory_kind == inject_pb2.MEMORY_KIND_CUDA_IPC and len(names) == 1 and names <= set(node.memory):
                    shm = node.memory[names.pop()]
                    sock = self._real.CacheSocket(inject_pb2.CacheSocketRequest(), **kw)
                    as_shm = inject_pb2.RegisterCacheRequest.FromString(req.SerializeToString())
                    as_shm.ClearField("ipc_handles")
                    as_shm.device = 0
                    as_shm.memory_kind = inject_pb2.MEMORY_KIND_SHM
                    as_shm.memory_handle = send_cache_file(sock.address, shm.fileno(), 10)
                    req = as_shm
                resp = self._real.RegisterCache(req, **kw)
                node.registered.append(resp.cache_id)
                return resp

            def UnregisterCache(self, req, **kw):
                node.unregistered.append(req.cache_id)
                return self._real.UnregisterCache(req, **kw)

        monkeypatch.setattr(inject_pb2_grpc, "InjectorStub", Stub)

    def kinds(self):
        return [inject_pb2.MemoryKind.Name(r.memory_kind) for r in self.requests]

    def shared(self, layers, shape):
        """An allocation for Runner: one shared-memory PagedCache of the
        layers, each layer a view of one tensor over all of it (as vLLM
        views its raw allocation), registered in memory."""
        layout = CacheLayout(math.prod(shape) // 2, 1, 1, 1)  # only its size matters: shape's f32 elements
        self.cache = PagedCache(layers, layout)
        whole = torch.frombuffer(self.cache._mm, dtype=torch.uint8)
        self.memory[storage_ptr(whole)] = self.cache
        self.offsets = list(self.cache.offsets)
        return [whole[o:o + layout.layer_bytes].view(torch.float32).view(shape) for o in self.offsets]


# (backend, where vLLM's cache lives): both shapes everywhere, the HND
# memory orders where the node writes vLLM's memory itself or through
# staging.
CASES = ([(b, w) for w in ("cpu", "gpu-staging", "gpu-ipc") for b in ("flash_attn", "flashinfer")]
         + [("flashinfer_hnd", "gpu-ipc"), ("flash_attn_hnd", "gpu-staging")])


@pytest.fixture(params=CASES, ids=[f"{b}-{w}" for b, w in CASES])
def setup(cluster, request, monkeypatch, caplog):
    backend, where = request.param
    tok = "vllm-test/" + request.node.name
    node = None
    if where != "cpu":
        standin = StandIn()
        monkeypatch.setattr(gpu, "cuda", standin)
        node = IPCNode(standin, monkeypatch)
    sched = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.SCHEDULER)
    worker = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.WORKER)
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall", tokenizer_id=tok)
    assert worker.spec.fingerprint() == sched.spec.fingerprint()
    with caplog.at_level(logging.INFO, logger="kvmesh"):
        run = Runner(model, worker, backend, node.shared if where == "gpu-ipc" else zeros)
    run.where, run.node = where, node
    # The node is given vLLM's memory order.
    assert worker.layout.order == run.order and worker.layout.shape == tuple(run.memory[0].shape)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if where == "cpu":
        assert (worker.transport, worker.fallback_reason, warned) == (HOST_STAGING, None, [])
    elif where == "gpu-staging":
        # Asked by IPC, refused, registered through staging; said once.
        assert node.kinds() == ["MEMORY_KIND_CUDA_IPC", "MEMORY_KIND_SHM"]
        assert worker.transport == HOST_STAGING and "UNIMPLEMENTED" in worker.fallback_reason
        assert len(warned) == 1 and worker.fallback_reason in warned[0]
    else:
        # One handle per layer, all of one allocation, at each layer's offset.
        (req,) = node.requests
        assert worker.transport == CUDA_IPC and worker.fallback_reason is None and warned == []
        assert req.memory_kind == inject_pb2.MEMORY_KIND_CUDA_IPC and req.layers == model.num_layers
        assert list(req.ipc_handles) == [worker._cache.ipc_handles[0]] * model.num_layers
        assert list(req.offsets) == node.offsets and node.offsets[1] > 0
        assert list(req.layouts) == [worker.layout.proto()]
    assert any(worker.transport in r.getMessage() for r in caplog.records if r.name == "kvmesh.vllm")
    yield sched, worker, run, model
    worker.shutdown()
    sched.shutdown()
    if node is not None:
        assert node.unregistered == node.registered[-1:]  # shutdown unregistered vLLM's cache
    if where == "gpu-ipc":
        node.cache.close()


def prompt():
    for p in json.loads((ROOT / "train" / "recall" / "eval.json").read_text())["prompts"][200:]:
        toks = p["system"] + [t for c in p["chunks"] for t in c] + p["question"]
        if len(toks) >= 3 * CHUNK + 10:
            return toks[:3 * CHUNK + 10]


def test_save_then_load_equals_prefill(setup):
    sched, worker, run, model = setup
    tokens = prompt()
    ref = model.prefill(tokens)
    blocks_a = list(range(20, 20 + 13))[::-1]  # scattered, descending blocks
    req, ext, meta = schedule(sched, "a", tokens, blocks_a)
    assert ext == 0 and not meta.loads and [s.chunks for s in meta.saves] == [[(0, 64), (64, 128), (128, 192)]]
    logits_a, slots_a, finished, errors = run.step(meta, tokens, blocks_a, 0)
    assert finished == (None, None) and errors == set()
    assert sched.request_finished(req, blocks_a) == (False, None)
    assert (logits_a - ref).abs().max().item() < 1e-4
    kv_a = [c.reshape(2, -1, *c.shape[3:])[:, slots_a[:192]].clone() for c in run.caches]

    # The same prompt again, in other blocks: the leading three chunks load.
    for c in run.caches:
        c.zero_()
    blocks_b = [40 + i for i in range(13)]
    req, ext, meta = schedule(sched, "b", tokens, blocks_b)
    assert ext == 3 * CHUNK and len(meta.loads) == 1 and not meta.saves
    logits_b, slots_b, _, errors = run.step(meta, tokens, blocks_b, 3 * CHUNK)
    assert errors == set()
    if run.where == "gpu-ipc":
        assert run.node.standin.calls == []  # nothing staged, pinned or copied: the node wrote vLLM's memory
    elif run.where == "gpu-staging":
        calls = [c[0] for c in run.node.standin.calls]
        assert calls[0] == "pin" and calls.count("copy") == calls.count("wait") == model.num_layers
    worst = max((c.reshape(2, -1, *c.shape[3:])[:, slots_b[:192]] - a).abs().max().item()
                for c, a in zip(run.caches, kv_a))
    print(f"loaded blocks vs prefill's: max |diff| {worst:.2g}; logits {(logits_b - ref).abs().max().item():.2g}")
    assert worst < 1e-5
    assert (logits_b - ref).abs().max().item() < 1e-4

    # vLLM's prefix cache already holds the first chunk: only the rest loads.
    blocks_c = [0] * 4 + [60 + i for i in range(9)]
    req, ext, meta = schedule(sched, "c", tokens, blocks_c, local_computed=CHUNK)
    assert ext == 2 * CHUNK
    assert all(s == -1 for s in meta.loads[0].chunks[0].slots)


def test_load_errors_are_reported(setup, cluster):
    sched, worker, run, model = setup
    tokens = prompt()
    blocks = list(range(13))
    _, _, meta = schedule(sched, "a", tokens, blocks)
    run.step(meta, tokens, blocks, 0)
    _, ext, meta = schedule(sched, "b", tokens, blocks)
    assert ext == 3 * CHUNK
    # The second chunk disappears between the lookup and the load.
    lost = meta.loads[0].chunks[1]
    with kvmesh.Client(cluster.seeds) as c:
        assert c.delete(kvmesh.Key(worker.fingerprint, lost.content, lost.want)) > 0
    _, _, _, errors = run.step(meta, tokens, blocks, 3 * CHUNK)
    assert errors == {4, 5, 6, 7}  # the blocks of tokens 64..127: vLLM recomputes them
    if run.where == "gpu-staging":
        # A copy from the staging to the device that fails is a load error
        # of every block the step loads, not an exception in the step.
        _, ext, meta = schedule(sched, "c", tokens, blocks)
        assert ext == CHUNK
        run.node.standin.wait_error = RuntimeError("CUDA error: an illegal memory access was encountered")
        _, _, _, errors = run.step(meta, tokens, blocks, CHUNK)
        assert errors == {0, 1, 2, 3}


def test_saving_without_capture_unrotates(setup):
    sched, worker, run, model = setup
    tokens = prompt()
    blocks = list(range(13))
    _, _, meta = schedule(sched, "a", tokens, blocks)
    run.step(meta, tokens, blocks, 0, capture=False)
    fp = worker.fingerprint
    chunks = [tokens[i * CHUNK:(i + 1) * CHUNK] for i in range(3)]
    ctxs, _ = kvmesh.prefix_chain(fp, chunks)
    with kvmesh.Client(worker.client.seeds) as c:
        got = c.get_entry(kvmesh.Key(fp, kvmesh.content_id(fp, chunks[2]), ctxs[2]))
    kv = torch.from_numpy(got.kv.copy())
    all_ = run.model.run(tokens, list(range(len(tokens))), run.model.new_cache(len(tokens)), list(range(len(tokens))),
                         Plan(active=list(range(len(tokens))), capture=True))
    want = torch.stack([torch.stack([k[128:192], v[128:192]]) for k, v in all_.kv])
    assert (kv - want).abs().max().item() < 1e-4


def layer_tensors(model, raw, start, shape):
    """vLLM-style layers: views of one raw tensor, layer l at element
    start + l * (its size)."""
    n = math.prod(shape)
    return {f"model.layers.{l}.self_attn.attn": raw[start + l * n:start + (l + 1) * n].view(shape)
            for l in range(model.num_layers)}


@pytest.fixture
def stand_in(cluster, monkeypatch):
    """A worker's world where CPU tensors stand for CUDA tensors: (a
    function making a worker connector with extra config, the IPCNode
    recording what reaches the node, the model)."""
    standin = StandIn()
    monkeypatch.setattr(gpu, "cuda", standin)
    node = IPCNode(standin, monkeypatch)
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall")
    made = []

    def worker(**extra):
        w = KvmeshConnector(vllm_config(cluster.seeds, "vllm-test/stand-in", **extra), KVConnectorRole.WORKER)
        made.append(w)
        return w
    yield worker, node, model
    for w in made:
        w.shutdown()


def test_misaligned_layers_fall_back(stand_in):
    """Layers that do not start on a 64-byte boundary of their allocation
    cannot be registered by CUDA IPC: "auto" stages them without asking
    the node for IPC, "never" refuses them."""
    worker, node, model = stand_in
    shape = BACKENDS["flash_attn"][0](model.config.num_kv_heads, model.config.head_dim)
    raw = torch.zeros(model.num_layers * math.prod(shape) + 8)
    caches = layer_tensors(model, raw, 8, shape)  # 32 bytes in
    with pytest.raises(kvmesh.UsageError, match="64-byte alignment"):
        worker(staging="never").register_kv_caches(caches)
    assert node.requests == []
    w = worker()
    w.register_kv_caches(caches)
    assert w.transport == HOST_STAGING and "at byte 32 of its allocation" in w.fallback_reason
    assert node.kinds() == ["MEMORY_KIND_SHM"]
    aligned = layer_tensors(model, raw, 0, shape)
    w = worker()
    w.register_kv_caches(aligned)
    assert node.kinds()[1:] == ["MEMORY_KIND_CUDA_IPC", "MEMORY_KIND_SHM"]
    assert list(node.requests[1].offsets) == [l * 4 * math.prod(shape) for l in range(model.num_layers)]


def test_registration_refusals(stand_in, monkeypatch):
    """staging "never" raises the node's refusal of IPC (a kvmeshd without
    the cuda tag); layers vLLM does not make are refused before anything
    is sent; a cache in host memory cannot be "never"."""
    worker, node, model = stand_in
    H, D = model.config.num_kv_heads, model.config.head_dim
    shape = BACKENDS["flashinfer"][0](H, D)
    caches = layer_tensors(model, torch.zeros(model.num_layers * math.prod(shape)), 0, shape)
    never = worker(staging="never")
    with pytest.raises(kvmesh.KvmeshError, match="UNIMPLEMENTED"):
        never.register_kv_caches(caches)
    assert node.kinds() == ["MEMORY_KIND_CUDA_IPC"] and never.transport is None
    names = list(caches)
    bad = [
        ({names[0]: caches[names[0]]}, "layers for a"),
        ({n: t.permute(0, 1, 2, 4, 3) for n, t in caches.items()}, "layer of shape"),
        ({n: torch.zeros(NUM_BLOCKS, 2, H, D, BLOCK).permute(0, 1, 4, 2, 3) for n in names}, "strides"),
        ({**caches, names[1]: torch.zeros(NUM_BLOCKS, 2, H, BLOCK, D).transpose(2, 3)}, "memory order differs"),
        ({**caches, names[1]: caches[names[1]].half()}, "one shape, dtype and device"),
        ([caches[n] for n in names], "want a dict"),
    ]
    w = worker()
    for arg, why in bad:
        with pytest.raises(kvmesh.UsageError, match=why):
            w.register_kv_caches(arg)
    assert node.kinds() == ["MEMORY_KIND_CUDA_IPC"]
    with pytest.raises(kvmesh.UsageError, match="staging 'sometimes'"):
        worker(staging="sometimes")
    monkeypatch.setattr(gpu, "cuda", gpu.CUDA())  # the real seam: CPU tensors are host memory
    with pytest.raises(kvmesh.UsageError, match="host memory"):
        worker(staging="never").register_kv_caches(caches)


HAVE_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
@pytest.mark.parametrize("device", ["stand-in", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAVE_CUDA, reason="no CUDA"))])
def test_cuda_cache_loads(cluster, monkeypatch, device, backend):
    """vLLM's cache as CUDA tensors (on a GPU: real ones and the real seam,
    scripts/device/gpu-check.sh; here CPU tensors behind the stand-in),
    its layers views of one raw allocation as vLLM makes them, registered
    with the session's kvmeshd (no cuda tag): "auto" asks by CUDA IPC,
    falls back to host staging on the node's Unimplemented, and the
    blocks a second request loads equal the first request's prefill."""
    if device == "stand-in":
        monkeypatch.setattr(gpu, "cuda", StandIn())
    tok = f"vllm-test/cuda-{device}-{backend}"
    sched = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.SCHEDULER)
    host = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.WORKER)
    dev = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.WORKER)
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall", tokenizer_id=tok)
    try:
        # A first request computed (and saved) in a cache in host memory.
        run = Runner(model, host, backend)
        tokens = prompt()
        blocks_a = list(range(20, 33))
        _, _, meta = schedule(sched, "a", tokens, blocks_a)
        run.step(meta, tokens, blocks_a, 0)
        slots_a = [blocks_a[t // BLOCK] * BLOCK + t % BLOCK for t in range(3 * CHUNK)]
        kv_a = [c.reshape(2, -1, *c.shape[3:])[:, slots_a].clone() for c in run.caches]

        shape = BACKENDS[backend][0](model.config.num_kv_heads, model.config.head_dim)
        on = "cuda" if device == "cuda" else "cpu"
        caches = layer_tensors(model, torch.zeros(model.num_layers * math.prod(shape), device=on), 0, shape)
        dev.register_kv_caches(caches)
        print(f"transport {dev.transport}: {dev.fallback_reason}")
        assert dev.transport == HOST_STAGING and "UNIMPLEMENTED" in dev.fallback_reason

        blocks_b = [40 + i for i in range(13)]
        _, ext, meta = schedule(sched, "b", tokens, blocks_b)
        assert ext == 3 * CHUNK
        md = types.SimpleNamespace(slot_mapping=torch.arange(3 * CHUNK, len(tokens), device=on))
        dev.bind_connector_metadata(meta)
        dev.start_load_kv(types.SimpleNamespace(attn_metadata={n: md for n in caches}, no_compile_layers={}))
        for n in caches:
            dev.wait_for_layer_load(n)
        dev.wait_for_save()
        assert dev.get_block_ids_with_load_errors() == set()
        dev.clear_connector_metadata()
        slots_b = torch.tensor([blocks_b[t // BLOCK] * BLOCK + t % BLOCK for t in range(3 * CHUNK)])
        worst = 0.0
        for t, a in zip(caches.values(), kv_a):
            c = t if t.shape[0] == 2 else t.transpose(0, 1)  # [2, blocks, block, heads, dim]
            got = c.reshape(2, -1, *c.shape[3:])[:, slots_b.to(t.device)].cpu()
            worst = max(worst, (got - a).abs().max().item())
        print(f"loaded blocks vs prefill's: max |diff| {worst:.2g}")
        assert worst < 1e-5
    finally:
        for c in (dev, host, sched):
            c.shutdown()


def test_reads_the_named_interface():
    assert len(VLLM_COMMIT) == 40
    names = ["get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
             "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
             "get_finished", "get_block_ids_with_load_errors", "shutdown", "get_required_kvcache_layout"]
    for n in names:
        assert callable(getattr(KvmeshConnector, n))
    if not HAVE_VLLM:
        assert KvmeshConnector.get_required_kvcache_layout(None) == "NHD"


def test_capture_hooks_record_pre_rope_keys(setup):
    """capture_hooks' pre-hook on rotary_emb sees vLLM's (positions, q, k)
    before rotation and records k for the layer, in module order."""
    from kvmesh.vllm import capture_hooks
    _, worker, _, model = setup
    kv = model.config.num_kv_heads * model.config.head_dim

    class Rotary(torch.nn.Module):
        def forward(self, positions, q, k):
            return q * 2, k * 2  # stands in for the rotation

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rotary_emb = Rotary()

        def forward(self, positions, q, k):
            return self.rotary_emb(positions, q, k)

    net = torch.nn.ModuleList([Attention() for _ in range(model.num_layers)])
    hooks = capture_hooks(net, worker)
    keys = [torch.randn(5, kv) for _ in net]
    for layer, k in zip(net, keys):
        layer(torch.arange(5), torch.randn(5, 8), k)
    for h in hooks:
        h.remove()
    for l, k in enumerate(keys):
        assert torch.equal(worker._keys[l], k.view(5, model.config.num_kv_heads, model.config.head_dim))
    with pytest.raises(kvmesh.UsageError, match="no module matches"):
        capture_hooks(torch.nn.Linear(2, 2), worker)
