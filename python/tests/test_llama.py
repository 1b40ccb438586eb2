"""kvmesh.torch.LlamaModel against Go's engine: the same logits (to
float32 rounding) and greedy continuations on the random-weight variants
the engine's tests use (rebuilt here from the same seed) and on the trained
recall model (engine/testdata/python_logits.json, written by
`go test ./engine -run TestPythonVectors -update-python`)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvmesh  # noqa: E402
from conftest import ROOT  # noqa: E402
from gorand import random_tensors  # noqa: E402
from kvmesh import safetensors  # noqa: E402
from kvmesh.torch import LlamaModel  # noqa: E402

VECTORS = json.loads((ROOT / "engine" / "testdata" / "python_logits.json").read_text())
TOL = 2e-4  # float32 summation order (the engine's kernels) and RoPE in torch


def write_model(dir, cfg: dict, tensors, shards=1, dtype="F32"):
    (dir / "config.json").write_text(json.dumps(cfg))
    if shards == 1:
        safetensors.write(str(dir / "model.safetensors"), tensors, {"format": "pt"}, dtype)
        return
    names = sorted(tensors)
    wm = {}
    for s in range(shards):
        part = {n: tensors[n] for i, n in enumerate(names) if i * shards // len(names) == s}
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        safetensors.write(str(dir / fn), part, {"format": "pt"}, dtype)
        wm.update({n: fn for n in part})
    (dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))


def check(model, vec):
    assert model.spec.weights_revision == vec["revision"]
    worst = 0.0
    for p in vec["prompts"]:
        got = model.prefill(p["tokens"])
        want = torch.tensor(p["logits"])
        worst = max(worst, (got - want).abs().max().item())
        assert model.generate(p["tokens"], len(p["generated"])) == p["generated"]
    print(f"{vec['name']}: max |logit diff| {worst:.2g}")
    assert worst <= TOL


@pytest.mark.parametrize("vec", [v for v in VECTORS["models"] if "config" in v], ids=lambda v: v["name"])
def test_random_variants_match_the_engine(tmp_path, vec):
    cfg = json.loads(json.dumps(vec["config"]))
    write_model(tmp_path, cfg, random_tensors(cfg, VECTORS["seed"]), shards=2 if "bias" in vec["name"] else 1)
    check(LlamaModel.from_pretrained(tmp_path), vec)


def test_recall_model_matches_the_engine():
    (vec,) = [v for v in VECTORS["models"] if v["name"] == "train/recall"]
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall")
    check(model, vec)
    # The same weights, the same spec: Go's and Python's fingerprints agree.
    assert model.spec.family == "llama" and model.spec.dtype == kvmesh.DType.F32


def test_paged_cache_layouts_and_slots():
    """Scattered slots and an HND cache give the logits of a plain prefill."""
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall")
    tokens = VECTORS["models"][-1]["prompts"][1]["tokens"][:50]
    ref = model.prefill(tokens)
    n = len(tokens)
    slots = [(7 * i + 3) % 64 for i in range(n)]  # 64 slots, a permutation's prefix
    nhd = model.new_cache(64, block_size=16)
    got = model.forward(tokens, list(range(n)), nhd, slots, slots)
    assert (got - ref).abs().max().item() < 1e-4  # batch shapes change float32 summation order
    hnd = [torch.zeros(2, 4, model.config.num_kv_heads, 16, model.config.head_dim) for _ in range(model.num_layers)]
    # Prefill in two steps: the second reads the first's KV from the cache.
    model.forward(tokens[:30], list(range(30)), hnd, slots[:30], slots[:30])
    got = model.forward(tokens[30:], list(range(30, n)), hnd, slots[30:], slots)
    assert (got - ref).abs().max().item() < 1e-4  # batch shapes change float32 summation order
    assert (hnd[1].transpose(2, 3) - nhd[1]).abs().max().item() < 1e-4


def test_bf16_checkpoint_and_dtypes(tmp_path):
    (vec,) = [v for v in VECTORS["models"] if v["name"] == "llama-neox"]
    cfg = dict(vec["config"], torch_dtype="bfloat16")
    write_model(tmp_path, cfg, random_tensors(vec["config"], VECTORS["seed"]), dtype="BF16")
    m = LlamaModel.from_pretrained(tmp_path)
    assert m.spec.dtype == kvmesh.DType.F32  # computes and stores KV in float32 unless told
    assert m.config.dtype == kvmesh.DType.BF16
    b = LlamaModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert b.spec.dtype == kvmesh.DType.BF16 and b.spec.fingerprint() != m.spec.fingerprint()
    t = vec["prompts"][1]["tokens"]
    assert (b.prefill(t) - m.prefill(t)).abs().max().item() < 0.5  # bf16 is close, not equal


def test_errors(tmp_path):
    with pytest.raises(kvmesh.UsageError, match="checkpoint directory"):
        LlamaModel.from_pretrained(tmp_path / "nothing")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(kvmesh.ModelError, match="unsupported model_type 'gpt2'"):
        LlamaModel.from_pretrained(tmp_path)
    (vec,) = [v for v in VECTORS["models"] if v["name"] == "llama-neox"]
    ts = random_tensors(vec["config"], 1)
    ts["model.layers.0.mlp.extra.weight"] = np.zeros(3, np.float32)
    write_model(tmp_path, vec["config"], ts)
    with pytest.raises(kvmesh.ModelError, match="'model.layers.0.mlp.extra.weight' is not used"):
        LlamaModel.from_pretrained(tmp_path)
    del ts["model.layers.0.mlp.extra.weight"], ts["model.norm.weight"]
    write_model(tmp_path, vec["config"], ts)
    with pytest.raises(kvmesh.ModelError, match="missing tensor 'model.norm.weight'"):
        LlamaModel.from_pretrained(tmp_path)
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall")
    with pytest.raises(kvmesh.UsageError, match="max_new_tokens"):
        model.generate([1, 2], -1)
    with pytest.raises(kvmesh.UsageError, match="one each"):
        model.forward([1, 2], [0, 1], model.new_cache(4), [0], [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    (vec,) = [v for v in VECTORS["models"] if v["name"] == "train/recall"]
    cpu = LlamaModel.from_pretrained(ROOT / "train" / "recall")
    gpu = LlamaModel.from_pretrained(ROOT / "train" / "recall", device="cuda")
    for p in vec["prompts"]:
        assert (gpu.prefill(p["tokens"]).cpu() - cpu.prefill(p["tokens"])).abs().max().item() < TOL
        assert gpu.generate(p["tokens"], len(p["generated"])) == p["generated"]
