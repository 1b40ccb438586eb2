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
2, block_size, kv_heads, head_dim], the model being kvmesh.torch.LlamaModel
on the trained recall model."""

import json
import types

import pytest

torch = pytest.importorskip("torch")

import kvmesh  # noqa: E402
from conftest import ROOT  # noqa: E402
from kvmesh.torch import LlamaModel  # noqa: E402
from kvmesh.torch.llama import Plan  # noqa: E402
from kvmesh.vllm import HAVE_VLLM, KvmeshConnector, KVConnectorRole, VLLM_COMMIT  # noqa: E402

BLOCK, CHUNK, NUM_BLOCKS = 16, 64, 64
HF = json.loads((ROOT / "train" / "recall" / "config.json").read_text())


def vllm_config(addrs, tokenizer):
    ns = types.SimpleNamespace
    return ns(kv_transfer_config=ns(kv_connector="KvmeshConnector", kv_connector_module_path="kvmesh.vllm",
                                    kv_role="kv_both",
                                    kv_connector_extra_config={"addrs": ",".join(addrs), "chunk_tokens": CHUNK,
                                                               "tokenizer_id": tokenizer}),
              cache_config=ns(block_size=BLOCK, cache_dtype="auto"),
              model_config=ns(hf_config=HF, dtype=torch.float32, model="train/recall", revision=None))


class Blocks:
    """vLLM's KVCacheBlocks: get_block_ids() is one list per cache group."""

    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


class Runner:
    """The model runner's side of one step, in vLLM's order. vllm holds the
    layers as the attention backend shapes them (FlashAttention's, or
    FlashInfer's with K and V inside each block); caches are the same
    memory as [2, num_blocks, block_size, kv_heads, head_dim] views, which
    the model reads and writes."""

    def __init__(self, model, worker, backend):
        self.model, self.worker = model, worker
        self.names = [f"model.layers.{l}.self_attn.attn" for l in range(model.num_layers)]
        hd = (model.config.num_kv_heads, model.config.head_dim)
        if backend == "flash_attn":
            self.vllm = [torch.zeros(2, NUM_BLOCKS, BLOCK, *hd) for _ in self.names]
            self.caches = self.vllm
        else:
            self.vllm = [torch.zeros(NUM_BLOCKS, 2, BLOCK, *hd) for _ in self.names]
            self.caches = [t.transpose(0, 1) for t in self.vllm]
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


@pytest.fixture(params=["flash_attn", "flashinfer"])
def setup(cluster, request):
    tok = "vllm-test/" + request.node.name
    sched = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.SCHEDULER)
    worker = KvmeshConnector(vllm_config(cluster.seeds, tok), KVConnectorRole.WORKER)
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall", tokenizer_id=tok)
    assert worker.spec.fingerprint() == sched.spec.fingerprint()
    run = Runner(model, worker, request.param)
    # The staging the node writes has the backend's own shape.
    assert worker._staging.layout.shape == tuple(run.vllm[0].shape)
    yield sched, worker, run, model
    worker.shutdown()
    sched.shutdown()


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
