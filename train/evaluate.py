"""Held-out exact match of a trained model in PyTorch (teacher-forced
greedy, as train.py measures it), per task and k, on a fresh evaluation
set of the generator:

    /usr/bin/python3 train/evaluate.py --model train/recall --seed 4321 --n 40

The numbers in train/README.md were measured this way; the cluster's own
measurement is `make bench-accuracy`.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402
import model as M  # noqa: E402
import train as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="directory with config.json and model.safetensors")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--n", type=int, default=40, help="prompts per task and k")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = M.load_hf(a.model)
    sets = {}
    for p in gen.eval_sets(gen.Vocab(), seed=a.seed, ks=(5, 10, 20, 50), n=a.n):
        sets.setdefault((p["task"], p["k"]), []).append(p)
    print(" ".join(f"{k}={v:.2f}" for k, v in T.evaluate(m, sets).items()))


if __name__ == "__main__":
    main()
