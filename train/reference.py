"""Reference outputs of the trained model in PyTorch, for the Go engine to be
checked against, and PyTorch's prefill speed on the same model.

    /usr/bin/python3 train/reference.py --model train/recall --eval train/recall/eval.json \
        --out train/recall/reference.json --threads 2

reference.json holds, for the first prompt of each task at k = 5, the
prompt tokens and the next-token logits after it (full prefill); PyTorch's
greedy answers to a handful of prompts; the prefill speed (tokens/s at each
prompt length measured); with --accuracy, the greedy exact-match accuracy
PyTorch gets on the whole evaluation set per task and k.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402


def prompt_tokens(p):
    return p["system"] + [t for c in p["chunks"] for t in c] + p["question"]


def greedy(m, toks, stop, limit):
    out = []
    with torch.no_grad():
        for _ in range(limit):
            nxt = int(m(torch.tensor([toks + out]))[0, -1].argmax())
            out.append(nxt)
            if nxt == stop:
                break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--accuracy", action="store_true", help="also decode the whole set (slow)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = M.load_hf(a.model).eval()
    ev = json.load(open(a.eval))
    stop = ev["stop"]
    limit = max(len(p["answer"]) for p in ev["prompts"]) + 1
    out = {"threads": a.threads, "torch": torch.__version__, "logits": [], "speed": [], "accuracy": {}}
    seen = set()
    for p in ev["prompts"]:
        if p["k"] != 5 or p["task"] in seen:
            continue
        seen.add(p["task"])
        toks = prompt_tokens(p)
        with torch.no_grad():
            lg = m(torch.tensor([toks]))[0, -1]
        out["logits"].append({"task": p["task"], "k": p["k"], "tokens": toks,
                              "logits": [round(float(x), 6) for x in lg]})
    # Greedy answers on a handful of prompts (the first 4 of facts and rag
    # at k = 5 and 10), for the engine's answers to be compared with.
    out["answers"] = []
    count = {}
    for p in ev["prompts"]:
        key = (p["task"], p["k"])
        if p["task"] in ("facts", "rag") and p["k"] in (5, 10) and count.get(key, 0) < 4:
            count[key] = count.get(key, 0) + 1
            out["answers"].append({"task": p["task"], "k": p["k"], "index": p["index"],
                                   "answer": greedy(m, prompt_tokens(p), stop, limit)})
    # Prefill speed: one prompt per length, best of 3 runs.
    for task, k in (("facts", 50), ("rag", 50), ("rag", 20), ("facts", 10)):
        p = next(q for q in ev["prompts"] if q["task"] == task and q["k"] == k)
        ids = torch.tensor([prompt_tokens(p)])
        best = float("inf")
        with torch.no_grad():
            m(ids)
            for _ in range(3):
                t = time.perf_counter()
                m(ids)
                best = min(best, time.perf_counter() - t)
        n = ids.shape[1]
        out["speed"].append({"tokens": n, "seconds": best, "tokens_per_s": n / best})
        print(f"pytorch prefill {n} tokens: {n / best:.0f} tok/s ({a.threads} threads)", flush=True)
    if a.accuracy:
        acc = {}
        for p in ev["prompts"]:
            got = greedy(m, prompt_tokens(p), stop, limit)
            key = f"{p['task']}@{p['k']}"
            ok, n = acc.get(key, (0, 0))
            acc[key] = (ok + int(got == p["answer"]), n + 1)
        out["accuracy"] = {k: ok / n for k, (ok, n) in acc.items()}
        print(json.dumps(out["accuracy"]), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
