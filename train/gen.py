"""Seeded synthetic corpus for the recall model: one generator makes the
training stream and the held-out evaluation sets.

Every prompt is the shared system prompt, then k chunks, then one question:

    <bos> you are a helpful assistant ... . <chunk> ... <chunk> ? <key>

and the answer is the tokens after the key up to and including the first
".". The question ends with the key itself (no answer marker), so that the
answer is what follows the same key in the context: a model learns that
copy (an induction head) far sooner than one that must first look past a
marker.

Tasks (each chunk is what kvmesh stores as one unit):
  facts   k memory facts "<person> <relation> <value> ." in random order;
          question "? <person> <relation>" -> "<value> .".
  rag     k passages "# <entity> <attr> <value...> . <entity> <attr>
          <value...> ." of 2-3 sentences, each naming the passage's
          entity; question "? <entity> <attr>" -> the value span (one
          token, or the two of a person's name) and ".".
  twohop  k facts, half "<person> works_at <entity> ." and half
          "<entity> in <city> ."; question "? <person> city" -> the city
          of the entity the person works at.

People and entities are names of two sub-tokens, no two in one prompt sharing
a part (in training, a quarter of the prompts share parts on purpose). A fixed set of sub-token
combinations never appears in training; the evaluation sets use only those
(held-out entities), so the model must copy from its context, not recall.

The vocabulary is a word list (one token per word); prompts are token ids.
"""

import json
import random

SYSTEM = "you are a helpful assistant . answer the question from the context only .".split()
SPECIALS = ["<pad>", "<bos>", ".", "?", "=", "#", ":"]

_CONS = "bcdfghjklmnprstvz"
_VOW = "aeiou"


def _syllables(n, rng, suffix=""):
    seen, out = set(), []
    while len(out) < n:
        s = rng.choice(_CONS) + rng.choice(_VOW) + (rng.choice("nrl") if rng.random() < 0.4 else "")
        if s not in seen:
            seen.add(s)
            out.append(s + suffix)
    return out


RELATIONS = ["lives_in", "works_as", "likes", "owns", "drives", "plays", "studies", "speaks", "eats", "wears"]
ATTRS = ["founded", "ceo", "city", "product", "staff", "sector"]


class Vocab:
    """The word list, fixed by a seed that is part of the model."""

    def __init__(self, seed=7):
        rng = random.Random(seed)
        self.first = _syllables(64, rng)          # person name, first part
        self.last = _syllables(64, rng, "-")      # second part (distinct tokens)
        self.ent1 = ["E" + s for s in _syllables(64, rng)]
        self.ent2 = ["-" + s for s in _syllables(64, rng)]
        self.values = {r: [f"{r[:3]}{i}" for i in range(12)] for r in RELATIONS}
        self.cities = [f"city{i}" for i in range(16)]
        self.products = [f"prod{i}" for i in range(12)]
        self.sectors = [f"sect{i}" for i in range(8)]
        self.digits = [str(i) for i in range(10)]
        self.years = [str(y) for y in range(1960, 2000)]
        self.staff = [f"staff{n}" for n in range(10, 210, 10)]
        words = SPECIALS + SYSTEM + self.first + self.last + self.ent1 + self.ent2
        words += RELATIONS + ATTRS + ["works_at", "in", "city"]
        for r in RELATIONS:
            words += self.values[r]
        words += self.cities + self.products + self.sectors + self.digits + self.years + self.staff
        self.words = []
        for w in words:
            if w not in self.words:
                self.words.append(w)
        self.id = {w: i for i, w in enumerate(self.words)}
        self.size = 576
        assert len(self.words) <= self.size, len(self.words)

    def ids(self, words):
        return [self.id[w] for w in words]


def _held_out(i, j):
    # One combination in six is held out of training: j = i (mod 6), so
    # that every part is in some held-out name and one prompt can hold up
    # to 64 held-out names without a shared part.
    return (i - j) % 6 == 0


class Generator:
    """Draws prompts for one split: "train" or "eval" (held-out names)."""

    def __init__(self, vocab, split, seed):
        self.v = vocab
        self.rng = random.Random(seed)
        held = split == "eval"
        # Training prompts often draw their names from a few parts, so that
        # many names share a first or second part: the model must match the
        # whole name, not the part that happens to be unique in an easy prompt.
        self.hard = not held
        self.people = [(a, b) for i, a in enumerate(vocab.first) for j, b in enumerate(vocab.last)
                       if _held_out(i, j) == held]
        self.ents = [(a, b) for i, a in enumerate(vocab.ent1) for j, b in enumerate(vocab.ent2)
                     if _held_out(i, j) == held]

    def _names(self, pool, n):
        """n names from pool, no two sharing a part (names are distinctive
        within one context); in training, a quarter of the time from a few
        first and second parts instead (hard negatives)."""
        rng = self.rng
        if not self.hard or rng.random() < 0.75:
            for _ in range(100):
                used0, used1, out = set(), set(), []
                for p in rng.sample(pool, len(pool)):
                    if p[0] not in used0 and p[1] not in used1:
                        out.append(p)
                        used0.add(p[0])
                        used1.add(p[1])
                        if len(out) == n:
                            return out
            return rng.sample(pool, n)
        firsts = sorted({p[0] for p in pool})
        seconds = sorted({p[1] for p in pool})
        allowed = set(pool)
        side = 2
        while True:
            cand = [(a, b) for a in rng.sample(firsts, side) for b in rng.sample(seconds, side)
                    if (a, b) in allowed]
            if len(cand) >= n:
                return rng.sample(cand, n)
            side += 1

    # Each task returns (chunks, questions): chunks are word lists, questions
    # are (key words, answer words) pairs with distinct keys.

    def facts(self, k, nq):
        rng = self.rng
        people = self._names(self.people, max(1, (k + 1) // 2))
        keys, chunks = set(), []
        while len(chunks) < k:
            p, r = rng.choice(people), rng.choice(RELATIONS)
            if (p, r) in keys:
                continue
            keys.add((p, r))
            val = rng.choice(self.v.values[r])
            chunks.append(([p[0], p[1], r, val, "."], (p, r, val)))
        qs = [([c[1][0][0], c[1][0][1], c[1][1]], [c[1][2], "."]) for c in rng.sample(chunks, min(nq, k))]
        return [c[0] for c in chunks], qs

    def _attr_value(self, a):
        rng, v = self.rng, self.v
        if a == "founded":
            return [rng.choice(v.years)]
        if a == "ceo":
            return list(rng.choice(self.people))
        if a == "city":
            return [rng.choice(v.cities)]
        if a == "product":
            return [rng.choice(v.products)]
        if a == "staff":
            return [rng.choice(v.staff)]
        return [rng.choice(v.sectors)]

    def rag(self, k, nq):
        rng = self.rng
        ents = self._names(self.ents, k)
        chunks, cands = [], []
        for e in ents:
            # Each sentence names its entity, as encyclopedic passages do;
            # the question's key is then the words before the answer span.
            words = ["#"]
            for a in rng.sample(ATTRS, rng.choice([2, 3])):
                val = self._attr_value(a)
                words += [e[0], e[1], a] + val + ["."]
                cands.append(([e[0], e[1], a], val + ["."]))
            chunks.append(words)
        return chunks, rng.sample(cands, min(nq, len(cands)))

    def twohop(self, k, nq):
        rng = self.rng
        n = max(1, k // 2)
        people = self._names(self.people, n)
        ents = self._names(self.ents, n)
        works, located = [], []
        for p, e in zip(people, rng.sample(ents, n)):
            works.append(([p[0], p[1], "works_at", e[0], e[1], "."], p, e))
        city = {e: rng.choice(self.v.cities) for e in ents}
        for e in ents:
            located.append([e[0], e[1], "in", city[e], "."])
        chunks = [w[0] for w in works] + located
        rng.shuffle(chunks)
        qs = [([w[1][0], w[1][1], "city"], [city[w[2]], "."]) for w in rng.sample(works, min(nq, n))]
        return chunks, qs

    def sample(self, task, k, nq=1):
        return {"facts": self.facts, "rag": self.rag, "twohop": self.twohop}[task](k, nq)


def prompt_words(chunks, key):
    """The whole prompt (without answer) as words."""
    out = ["<bos>"] + SYSTEM
    for c in chunks:
        out += c
    return out + ["?"] + key


def training_sequence(v, chunks, qs):
    """Ids, a loss mask and sources: the context, then each question and its
    answer; only answer tokens are scored. sources[j] is, for an answer
    token, the position in the context of the same token after the same
    key (where a model that reads its context finds it), else -1."""
    words = ["<bos>"] + SYSTEM
    for c in chunks:
        words += c
    n = len(words)
    mask = [0] * n
    sources = [-1] * n
    for key, ans in qs:
        q = ["?"] + key
        src = _find(words, n, key + ans)
        words += q + ans
        mask += [0] * len(q) + [1] * len(ans)
        sources += [-1] * len(q) + [src + len(key) + j if src >= 0 else -1 for j in range(len(ans))]
    return v.ids(words), mask, sources


def _find(words, n, pat):
    """The first position of pat in words[:n], or -1."""
    for i in range(n - len(pat) + 1):
        if words[i] == pat[0] and words[i:i + len(pat)] == pat:
            return i
    return -1


def eval_sets(v, seed, ks=(5, 10, 20, 50), n=40, tasks=("facts", "rag", "twohop")):
    """Held-out evaluation prompts: for each task and k, n prompts of one
    question each, with the chunk boundaries kvmesh stores by."""
    g = Generator(v, "eval", seed)
    out = []
    for task in tasks:
        for k in ks:
            for i in range(n):
                chunks, qs = g.sample(task, k, 1)
                key, ans = qs[0]
                out.append({
                    "task": task, "k": k, "index": i,
                    "system": v.ids(["<bos>"] + SYSTEM),
                    "chunks": [v.ids(c) for c in chunks],
                    "question": v.ids(["?"] + key),
                    "answer": v.ids(ans),
                })
    return out


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1234, help="evaluation seed")
    ap.add_argument("--n", type=int, default=40, help="prompts per task and k")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", default="facts,rag,twohop", help="tasks, comma-separated")
    ap.add_argument("--ks", default="5,10,20,50", help="values of k, comma-separated")
    ap.add_argument("--vocab-out")
    a = ap.parse_args()
    v = Vocab()
    tasks = tuple(a.tasks.split(","))
    ks = tuple(int(k) for k in a.ks.split(","))
    with open(a.out, "w") as f:
        json.dump({"seed": a.seed, "stop": v.id["."], "prompts": eval_sets(v, a.seed, ks=ks, n=a.n, tasks=tasks)}, f,
                  separators=(",", ":"))
    if a.vocab_out:
        with open(a.vocab_out, "w") as f:
            json.dump(v.words, f)


if __name__ == "__main__":
    main()
