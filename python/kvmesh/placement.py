"""Placement of chunks on cluster members: weighted rendezvous hashing of a
chunk's content ID, exactly as Go's ring package computes it
(docs/PLACEMENT.md is the specification).

Every member gets a score for a content ID; the members with the highest
scores, best first, are its replicas. Python floats are IEEE-754 binary64
and never fuse a multiply-add, so the logarithm below rounds exactly as
ring.detLog does.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Iterable, Sequence

from .keys import ID, M64, xxh64

__all__ = ["Member", "Ring", "fmix64", "det_log"]

_SEED_MEMBER_LO = 0x72696E672E6C6F2E  # "ring.lo."
_SEED_MEMBER_HI = 0x72696E672E68692E  # "ring.hi."


@dataclasses.dataclass(frozen=True)
class Member:
    """One node of a ring epoch."""

    id: str
    grpc_addr: str = ""
    raft_addr: str = ""
    gossip_addr: str = ""
    http_addr: str = ""
    weight: float = 0.0

    @property
    def effective_weight(self) -> float:
        """Zero, negative, NaN and infinite weights count as 1."""
        w = self.weight
        if not (w > 0) or math.isinf(w):
            return 1.0
        return w


def fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finaliser."""
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


_SQRT2_2 = math.sqrt(2) / 2


def det_log(x: float) -> float:
    """Natural logarithm of 0 < x < 1 by the FreeBSD e_log.c algorithm, as
    ring.detLog (every product rounded on its own)."""
    ln2_hi = 6.93147180369123816490e-01
    ln2_lo = 1.90821492927058770002e-10
    l1 = 6.666666666666735130e-01
    l2 = 3.999999999940941908e-01
    l3 = 2.857142874366239149e-01
    l4 = 2.222219843214978396e-01
    l5 = 1.818357216161805012e-01
    l6 = 1.531383769920937332e-01
    l7 = 1.479819860511658591e-01
    (b,) = struct.unpack("<Q", struct.pack("<d", x))
    ki = ((b >> 52) & 0x7FF) - 1022
    (f1,) = struct.unpack("<d", struct.pack("<Q", (b & ~(0x7FF << 52) & M64) | (1022 << 52)))
    if f1 < _SQRT2_2:
        f1 = f1 * 2
        ki -= 1
    f = f1 - 1
    k = float(ki)
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (l1 + s4 * (l3 + s4 * (l5 + s4 * l7)))
    t2 = s4 * (l2 + s4 * (l4 + s4 * l6))
    rr = t1 + t2
    hfsq = 0.5 * f * f
    return k * ln2_hi - ((hfsq - (s * (hfsq + rr) + k * ln2_lo)) - f)


class Ring:
    """The placement of one epoch: immutable. Members are deduplicated by
    ID (the one that sorts first by address and weight is kept) and sorted
    by ID; members without an ID are dropped."""

    def __init__(self, epoch: int, members: Iterable[Member]):
        ms = sorted((m for m in members if m.id),
                    key=lambda m: (m.id.encode(), m.grpc_addr.encode(), m.raft_addr.encode(),
                                   m.gossip_addr.encode(), _cmp_float(m.weight)))
        uniq: list[Member] = []
        for m in ms:
            if not uniq or uniq[-1].id != m.id:
                uniq.append(m)
        self.epoch = epoch
        self.members: tuple = tuple(uniq)
        self._uniform = all(m.effective_weight == uniq[0].effective_weight for m in uniq)
        self._nodes = []
        for m in uniq:
            h = xxh64(m.id.encode(), 0)
            self._nodes.append((h ^ _SEED_MEMBER_LO, fmix64(h ^ _SEED_MEMBER_HI), m.effective_weight))

    def __len__(self) -> int:
        return len(self.members)

    def score(self, content: ID, i: int) -> float:
        """Member i's weighted rendezvous score for content."""
        lo, hi, w = self._nodes[i]
        h = fmix64(content.lo ^ lo)
        h = fmix64(h ^ content.hi ^ hi)
        if self._uniform:
            return float(h >> 11)
        u = (float(h >> 12) + 0.5) * 2.0 ** -52
        return w / -det_log(u)

    def replicas(self, content: ID, n: int) -> "list[Member]":
        """The n members with the highest scores, best first (ties: lower
        ID first); all members when n exceeds their number."""
        n = min(n, len(self.members))
        if n <= 0:
            return []
        order = sorted(range(len(self.members)), key=lambda i: (-self.score(content, i), i))
        return [self.members[i] for i in order[:n]]

    def owner(self, content: ID) -> "Member | None":
        """The first replica of content (None on an empty ring)."""
        r = self.replicas(content, 1)
        return r[0] if r else None


def _cmp_float(w: float):
    # Go's cmp.Compare orders NaN before every other value.
    return (0, 0.0) if math.isnan(w) else (1, w)
