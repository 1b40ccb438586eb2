"""Measures answer accuracy of kvmesh.serve.Mesh against full prefill on
held-out prompts of the recall model (train/README.md), and prints the
table docs/PYTHON.md reports:

    /usr/bin/python3 train/gen.py --seed 4321 --n 20 --out /tmp/heldout.json
    /usr/bin/python3 python/tests/measure_mesh.py /tmp/heldout.json

It starts a 3-node kvmeshd cluster (bin/kvmeshd), stores each prompt's
system prompt (its own key) and passages encoded right after the system
prompt (context="after"), and answers each prompt by full prefill
(LlamaModel.generate) and with Mesh at approximate="use" and "recompute"
(r = 0.15), greedy, write_back off (every prompt sees only what was stored
"after")."""

import json
import pathlib
import sys
import tempfile
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import conftest  # noqa: E402
from conftest import ROOT  # noqa: E402
from kvmesh.serve import Mesh  # noqa: E402
from kvmesh.torch import LlamaModel  # noqa: E402


def main(path: str) -> None:
    torch.set_num_threads(1)
    data = json.loads(pathlib.Path(path).read_text())
    stop = data["stop"]
    limit = max(len(p["answer"]) for p in data["prompts"]) + 1
    model = LlamaModel.from_pretrained(ROOT / "train" / "recall", tokenizer_id="measure-mesh")
    ways = ("full prefill", "Mesh after system, use", "Mesh after system, recompute r=0.15")
    right: dict = {}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = conftest.start_cluster(pathlib.Path(tmp))
        try:
            with Mesh.connect(cluster.seeds, model) as mesh:
                for i, p in enumerate(data["prompts"]):
                    chunks = [p["system"]] + p["chunks"]
                    mesh.store(chunks[:1], context="prefix")
                    mesh.store(p["chunks"], context="after", prefix=p["system"])
                    flat = [t for c in chunks for t in c] + p["question"]
                    answers = [model.generate(flat, limit, stop=stop)]
                    for how in ("use", "recompute"):
                        answers.append(mesh.generate(chunks, p["question"], max_new_tokens=limit, stop=stop,
                                                     approximate=how, recompute=0.15, write_back=False))
                    cell = right.setdefault((p["task"], p["k"]), [0, 0, 0, 0])
                    cell[3] += 1
                    for w, a in enumerate(answers):
                        cell[w] += a == p["answer"]
                    if i % 20 == 19:
                        print(f"{i + 1}/{len(data['prompts'])} prompts, {time.time() - t0:.0f} s", file=sys.stderr)
        finally:
            cluster.stop()
    print(f"| task | k | prompts | {' | '.join(ways)} |")
    print("|---|---:|---:|" + "---:|" * len(ways))
    tot = [0, 0, 0, 0]
    for (task, k), c in sorted(right.items()):
        print(f"| {task} | {k} | {c[3]} | " + " | ".join(f"{100 * c[w] / c[3]:.1f}" for w in range(3)) + " |")
        tot = [a + b for a, b in zip(tot, c)]
    print(f"| all | | {tot[3]} | " + " | ".join(f"{100 * tot[w] / tot[3]:.1f}" for w in range(3)) + " |")
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
