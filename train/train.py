"""Trains the recall model on the generator's stream; writes the curve and
checkpoints (HF layout) as it goes, so a partial run is usable.

    /usr/bin/python3 train/train.py --out out/recall-run $(TRAIN_FLAGS)   # see the Makefile

Loss is on answer tokens only, plus (with --att-weight) an attention loss
that teaches one head of one layer to look at the answer token's source in
the context: the position after the same key (a retrieval head found by
gradient descent alone forms slowly; supervising where it should look makes
the model learn to read its context in a fraction of the steps). The loss
is for training only: the model is a plain Llama. The curriculum raises the
largest k from 4 to 50 as the model masters each (see the loop); each batch
holds one task at one k. Held-out accuracy is greedy exact match measured by
teacher forcing (greedy decoding gives the answer exactly when every answer
position's argmax is the answer token).
"""

import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402
import model as M  # noqa: E402

TASKS = ("facts", "rag", "twohop")
TASK_P = (0.4, 0.4, 0.2)


def batch_of(v, g, rng, task, k, budget, nq):
    seqs = []
    total = 0
    while True:
        chunks, qs = g.sample(task, k, nq)
        ids, mask, src = gen.training_sequence(v, chunks, qs)
        if seqs and total + len(ids) > budget:
            break
        seqs.append((ids, mask, src))
        total += len(ids)
        if len(seqs) >= 64:
            break
    t = max(len(s[0]) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    tgt = torch.full((len(seqs), t), -100, dtype=torch.long)
    src = torch.full((len(seqs), t), -1, dtype=torch.long)
    for i, (s, m, sr) in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        for j in range(1, len(s)):
            if m[j]:
                tgt[i, j - 1] = s[j]
                src[i, j - 1] = sr[j]
    return ids, tgt, src


def eval_batch(model, prompts):
    """Exact match of greedy answers for prompts of one (task, k)."""
    seqs, spans = [], []
    for p in prompts:
        ctx = p["system"] + [t for c in p["chunks"] for t in c] + p["question"]
        seqs.append(ctx + p["answer"])
        spans.append((len(ctx), len(p["answer"])))
    t = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    with torch.no_grad():
        pred = model.lm_head(model.hidden(ids)).argmax(-1)
    ok = 0
    for i, (a, n) in enumerate(spans):
        ok += int(torch.equal(pred[i, a - 1:a - 1 + n], ids[i, a:a + n]))
    return ok


def evaluate(model, sets):
    model.eval()
    out = {}
    for (task, k), prompts in sets.items():
        ok = sum(eval_batch(model, prompts[i:i + 8]) for i in range(0, len(prompts), 8))
        out[f"{task}@{k}"] = ok / len(prompts)
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--minutes", type=float, default=0,
                    help="wall-clock budget: the schedule (learning rate, curriculum) runs on "
                         "max(step/steps, elapsed/minutes), and training stops at 1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--budget", type=int, default=1024, help="tokens per batch")
    ap.add_argument("--nq", type=int, default=6, help="questions per training sequence")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=0, help="attention heads (default hidden/head-dim)")
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default heads/2)")
    ap.add_argument("--att-weight", type=float, default=0,
                    help="weight of the attention-supervision loss (0: off)")
    ap.add_argument("--att-layer", type=int, default=2, help="layer of the supervised head")
    ap.add_argument("--att-head", type=int, default=0, help="the supervised head")
    ap.add_argument("--task-p", default=",".join(str(p) for p in TASK_P),
                    help="probabilities of facts, rag and twohop batches")
    ap.add_argument("--ramp", type=float, default=0.8,
                    help="fraction of the run at which the curriculum's largest k reaches 50 at the latest")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-minutes", type=float, default=0, help="also evaluate this often")
    ap.add_argument("--eval-n", type=int, default=24)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-minutes", type=float, default=0,
                    help="end the run after this many minutes (the schedule still runs over --minutes)")
    ap.add_argument("--min-k", type=int, default=4,
                    help="the curriculum's largest k starts here (a resumed model may already handle large k)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    task_p = [float(x) for x in a.task_p.split(",")]
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    v = gen.Vocab()
    g = gen.Generator(v, "train", a.seed)
    heads = a.heads or a.hidden // a.head_dim
    kv_heads = a.kv_heads or max(1, heads // 2)
    c = M.Config(vocab=v.size, hidden=a.hidden, inter=a.inter, layers=a.layers,
                 heads=heads, kv_heads=kv_heads, head_dim=a.head_dim)
    model = M.Llama(c)
    att_layer = None
    if a.att_weight > 0:
        att_layer = model.model.layers[a.att_layer].self_attn
        att_layer.keep = True
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    os.makedirs(a.out, exist_ok=True)
    ck = os.path.join(a.out, "checkpoint.pt")
    start, level = 0, 4
    if a.resume and os.path.exists(ck):
        st = torch.load(ck)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start = st["step"]
        rng.setstate(st["rng"])
        level = st.get("level", 4)
        g.rng.setstate(st["grng"])
    level = max(level, a.min_k)
    # A small held-out set (its own seed, not the committed evaluation's).
    ev = {}
    for p in gen.eval_sets(v, seed=99, ks=(5, 20, 50), n=a.eval_n):
        ev.setdefault((p["task"], p["k"]), []).append(p)
    curve = open(os.path.join(a.out, "curve.jsonl"), "a")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params} config {c.hf()}", flush=True)
    warm = 100
    t0 = time.time()
    losses = []
    last_eval = time.time()
    step = start
    ema = 0.0
    while True:
        frac = step / a.steps
        if a.minutes > 0:
            frac = max(frac, (time.time() - t0) / (60 * a.minutes))
        if frac >= 1:
            break
        lr = a.lr * min(1, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        # Curriculum: the largest k grows by 30% whenever the running answer
        # accuracy passes 85% at the current one, and at least linearly to 50
        # at 80% of the run.
        if ema > 0.85 and level < 50:
            level, ema = min(50, int(level * 1.3) + 1), 0.0
        maxk = max(level, int(round(4 + 46 * min(1.0, frac / a.ramp))))
        task = rng.choices(TASKS, task_p)[0]
        if rng.random() < 0.3:
            k = maxk
        else:
            k = int(round(math.exp(rng.uniform(0, math.log(maxk)))))
        if task == "twohop":
            k = max(2, k)
        ids, tgt, src = batch_of(v, g, rng, task, k, a.budget, max(a.nq, k // 2))
        # Only answer positions are scored, so only they go through lm_head.
        sel = tgt.view(-1) >= 0
        h = model.hidden(ids).reshape(-1, c.hidden)[sel]
        logits = model.lm_head(h)
        loss = F.cross_entropy(logits, tgt.view(-1)[sel])
        if att_layer is not None:
            # Attention supervision: one head learns to look where the answer
            # is in the context (the token the position must predict, after
            # the same key). Training only; the model is a plain Llama.
            has = src >= 0
            if has.any():
                att = att_layer.att[:, a.att_head]  # [b, t, t]
                bi, qi = has.nonzero(as_tuple=True)
                p = att[bi, qi, src[bi, qi]]
                loss = loss + a.att_weight * -(p + 1e-6).log().mean()
        ema = 0.9 * ema + 0.1 * (logits.argmax(-1) == tgt.view(-1)[sel]).float().mean().item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 20 == 0:
            print(f"step {step+1} frac {frac:.3f} loss {sum(losses[-20:])/20:.4f} acc {ema:.2f} maxk {maxk} lr {lr:.2e} "
                  f"t {time.time()-t0:.0f}s", flush=True)
        step += 1
        done = step >= a.steps or (a.minutes > 0 and time.time() - t0 >= 60 * a.minutes) or \
            (a.stop_minutes > 0 and time.time() - t0 >= 60 * a.stop_minutes)
        due = step % a.eval_every == 0 or (a.eval_minutes > 0 and time.time() - last_eval >= 60 * a.eval_minutes)
        if due or done:
            last_eval = time.time()
            acc = evaluate(model, ev)
            rec = {"step": step, "time_s": round(time.time() - t0, 1), "frac": round(frac, 4), "maxk": maxk,
                   "loss": round(sum(losses[-a.eval_every:]) / len(losses[-a.eval_every:]), 4), "acc": acc}
            curve.write(json.dumps(rec) + "\n")
            curve.flush()
            print("eval", json.dumps(rec), flush=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "level": level,
                        "rng": rng.getstate(), "grng": g.rng.getstate()}, ck + ".tmp")
            os.replace(ck + ".tmp", ck)
            M.save_hf(model, os.path.join(a.out, "model"),
                      {"step": str(step), "seed": str(a.seed), "command": " ".join(sys.argv)})
        if done:
            break


if __name__ == "__main__":
    main()
