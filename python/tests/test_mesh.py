"""kvmesh.serve.Mesh against full prefill and against Go's engine: EXACT hits
give a full prefill's logits; on train/recall the same prompts give the same
matches and answers as kvmesh-bench -accuracy's code (RunAccuracy, recorded
in workload/testdata/python_mesh.json by
`go test ./workload -run TestPythonMeshVectors -args -update-python`)."""

import json

import pytest

torch = pytest.importorskip("torch")

import kvmesh  # noqa: E402
from conftest import ROOT  # noqa: E402
from kvmesh.serve import Mesh  # noqa: E402
from kvmesh.torch import LlamaModel  # noqa: E402

EVAL = json.loads((ROOT / "train" / "recall" / "eval.json").read_text())
VECTORS = json.loads((ROOT / "workload" / "testdata" / "python_mesh.json").read_text())


def recall(tokenizer):
    return LlamaModel.from_pretrained(ROOT / "train" / "recall", tokenizer_id=tokenizer)


@pytest.fixture(scope="module")
def torch_threads():
    torch.set_num_threads(2)


def parts(p):
    return [p["system"]] + p["chunks"], p["question"]


def test_exact_hits_equal_full_prefill(cluster, torch_threads):
    model = recall("mesh-test/exact")
    worst = 0.0
    with Mesh.connect(cluster.seeds, model) as mesh:
        for i in (0, 200, 330, 470):  # facts, rag and two-hop prompts, k up to 50
            chunks, q = parts(EVAL["prompts"][i])
            mesh.store(chunks, context="prefix")
            out = mesh.prefill(chunks, q, approximate="use", write_back=False)
            assert out.matches == ["EXACT"] * len(chunks)
            assert out.computed_tokens == len(q) and out.prompt_tokens == sum(map(len, chunks)) + len(q)
            ref = model.prefill([t for c in chunks for t in c] + q)
            worst = max(worst, (out.logits - ref).abs().max().item())
    print(f"EXACT hits vs full prefill on train/recall: max |logit diff| {worst:.2g}")
    assert worst <= 1e-5


def test_same_matches_and_answers_as_the_engine(cluster, torch_threads):
    methods = {m["name"]: m for m in VECTORS["methods"]}
    meshes = {}
    full = recall("mesh-test/full")
    try:
        for enc in ("EXACT", "standalone", "after system prompt"):
            meshes[enc] = Mesh.connect(cluster.seeds, recall(f"mesh-test/{enc}"))
        got = {name: [] for name in methods}
        matches = {name: [] for name in methods}
        for pi in VECTORS["prompts"]:
            p = EVAL["prompts"][pi]
            chunks, q = parts(p)
            gen = dict(max_new_tokens=VECTORS["limit"], stop=VECTORS["stop"], write_back=False)
            meshes["EXACT"].store(chunks, context="prefix")
            meshes["standalone"].store(chunks, context="standalone")
            meshes["after system prompt"].store(chunks[:1], context="prefix")
            meshes["after system prompt"].store(chunks[1:], context="after", prefix=p["system"])
            for name, m in methods.items():
                if not m["encoding"]:
                    got[name].append(full.generate([t for c in chunks for t in c] + q, VECTORS["limit"],
                                                   stop=VECTORS["stop"]))
                    continue
                mesh = meshes[m["encoding"]]
                how = "bound" if m["bound"] else "recompute" if m["recompute"] else "use"
                opts = dict(approximate=how, recompute=m["recompute"] or 0.15, bound=m["bound"] or 0.5)
                got[name].append(mesh.generate(chunks, q, **gen, **opts))
                matches[name].append(mesh.last.matches)
        for name, m in methods.items():
            same = sum(a == b for a, b in zip(got[name], m["answers"], strict=True))
            print(f"{name}: {same} of {len(m['answers'])} answers as the engine's")
            assert got[name] == m["answers"], name
            if m["matches"]:
                assert matches[name] == m["matches"], name
    finally:
        for m in meshes.values():
            m.close()


def test_write_back_makes_the_next_prompt_exact(cluster, torch_threads):
    model = recall("mesh-test/write-back")
    chunks, q = parts(EVAL["prompts"][210])
    with Mesh.connect(cluster.seeds, model) as mesh:
        mesh.store(chunks[:1], context="prefix")  # the system prompt only
        first = mesh.prefill(chunks, q)
        assert first.matches == ["EXACT"] + ["MISS"] * (len(chunks) - 1)
        assert len(first.stored) == len(chunks) - 1 and first.computed_tokens == first.prompt_tokens - len(chunks[0])
        again = mesh.prefill(chunks, q)
        assert again.matches == ["EXACT"] * len(chunks) and again.stored == []
        assert (again.logits - first.logits).abs().max().item() <= 1e-5
        assert set(first.timings) == {"inject", "compute", "write_back", "total"}


def test_recompute_and_bound(cluster, torch_threads):
    """Standalone encodings are APPROXIMATE; "recompute" recomputes the r
    fraction, a bound below every deviation recomputes every chunk whole
    (a full prefill's logits), and accept= can refuse a kind."""
    model = recall("mesh-test/bound")
    chunks, q = parts(EVAL["prompts"][205])
    ref = model.prefill([t for c in chunks for t in c] + q)
    with Mesh.connect(cluster.seeds, model) as mesh:
        mesh.store(chunks, context="standalone")
        use = mesh.prefill(chunks, q, approximate="use", write_back=False)
        assert use.matches == ["EXACT"] + ["APPROXIMATE"] * (len(chunks) - 1)
        assert use.computed_tokens == len(q) and use.deviations == [0.0] * len(chunks)
        rec = mesh.prefill(chunks, q, approximate="recompute", recompute=0.3, write_back=False)
        n_approx = sum(map(len, chunks[1:]))
        assert rec.computed_tokens == len(q) + -(-3 * n_approx // 10) and rec.fallbacks == []
        assert all(d > 0 for d in rec.deviations[1:])
        whole = mesh.prefill(chunks, q, approximate="bound", recompute=0.0, bound=1e-9, write_back=False)
        assert whole.fallbacks == list(range(1, len(chunks)))
        assert (whole.logits - ref).abs().max().item() <= 1e-4
        assert (use.logits - ref).abs().max().item() > 1e-3  # approximate KV is not exact
        refused = mesh.prefill(chunks, q, accept=("prefix", "window"), write_back=False)
        assert refused.matches == ["EXACT"] + ["MISS"] * (len(chunks) - 1)
        assert (refused.logits - ref).abs().max().item() <= 1e-4


def test_store_contexts(cluster, torch_threads):
    model = recall("mesh-test/contexts")
    fp = model.spec.fingerprint()
    chunks, _ = parts(EVAL["prompts"][5])
    with Mesh.connect(cluster.seeds, model) as mesh:
        keys = mesh.store(chunks, context="prefix")
        assert [k.context for k in keys] == kvmesh.prefix_chain(fp, chunks)[0]
        keys = mesh.store(chunks, context="window", window=8)
        assert [k.context for k in keys] == [kvmesh.window_or_prefix(fp, 8, chunks[:i]) for i in range(len(chunks))]
        keys = mesh.store(chunks[1:], context="after", prefix=chunks[0])
        assert {k.context for k in keys} == {kvmesh.prefix_chain(fp, chunks[:2])[0][1]}
        assert all(k.content == kvmesh.content_id(fp, c) for k, c in zip(keys, chunks[1:]))


@pytest.mark.parametrize("call, match", [
    (lambda m: m.store([[1, 2]], context="suffix"), "want one of prefix, standalone, window, after"),
    (lambda m: m.store([[1, 2]], context="window"), "needs window=w"),
    (lambda m: m.store([[1, 2]], context="after"), "needs prefix=tokens"),
    (lambda m: m.store([[1, 2]], prefix=[3]), "prefix= is for context 'after'"),
    (lambda m: m.store([1, 2]), "wrap one chunk"),
    (lambda m: m.store([[1, 2], []]), "chunk 1 is empty"),
    (lambda m: m.prefill([[1, 2]], [3], approximate="maybe"), "want one of use, recompute, bound"),
    (lambda m: m.prefill([[1, 2]], [3], recompute=2), r"fraction in \[0, 1\]"),
    (lambda m: m.prefill([[1, 2]], [3], accept=("sometimes",)), "prefix, window, standalone"),
    (lambda m: m.prefill([[1, 2]], "what?"), "list of token IDs"),
    (lambda m: m.prefill([[1] * 300], [3]), "exceed the cache's 256 slots"),
    (lambda m: m.generate([[1, 2]], [3], temperature=1), "unknown option 'temperature'"),
])
def test_mesh_errors(cluster, call, match, mesh_small):
    with pytest.raises(kvmesh.UsageError, match=match):
        call(mesh_small)


@pytest.fixture(scope="module")
def mesh_small(cluster):
    with Mesh.connect(cluster.seeds, recall("mesh-test/errors"), cache_tokens=256) as m:
        yield m


def test_connect_errors(cluster):
    with pytest.raises(kvmesh.UsageError, match="want a kvmesh.torch.LlamaModel"):
        Mesh.connect(cluster.seeds, object())
    with pytest.raises(kvmesh.UsageError, match="cache_tokens 0"):
        Mesh.connect(cluster.seeds, recall("mesh-test/x"), cache_tokens=0)
