"""Decoder of huff0 blocks (zstd's Huffman literal coding, RFC 8878 section
4.2.1), the entropy coder of the lossless codec's byte planes.

A block is a Huffman tree description (weights, FSE-compressed or direct)
followed by one backward bitstream (1X) or a 6-byte jump table and four
(4X). Pure Python: about a microsecond per symbol, meant for checking
entries and small chunks (a node decodes large ones: Client.get_range).
"""

from __future__ import annotations

import numpy as np


class Huff0Error(ValueError):
    """The block is malformed."""


_MAX_TABLE_LOG = 11  # huff0's tableLogMax
_FSE_MAX_LOG = 6  # weights are FSE-coded with at most 2^6 states


def _highbit(v: int) -> int:
    return v.bit_length() - 1


class _BackwardBits:
    """Reads a zstd backward bitstream: from the last byte towards the first,
    most significant bits first, after the final byte's padding marker."""

    def __init__(self, data: bytes):
        if not data or data[-1] == 0:
            raise Huff0Error("bitstream without an end marker")
        self.x = int.from_bytes(data, "little")
        self.pos = self.x.bit_length() - 1  # bits left, marker excluded

    def read(self, n: int) -> int:
        """n bits; reading past the start yields zeros (pos goes negative)."""
        if n == 0:
            return 0
        p = self.pos - n
        self.pos = p
        if p >= 0:
            return (self.x >> p) & ((1 << n) - 1)
        return (self.x << -p) & ((1 << n) - 1) if self.pos + n > 0 else 0


def _read_ncount(data: bytes, max_symbol: int) -> "tuple[list[int], int, int]":
    """Reads an FSE table description; returns (normalized counts, table
    log, bytes used)."""
    x = int.from_bytes(data[:64], "little")
    limit = 8 * min(len(data), 64)
    bit = 0

    def peek(n):
        return (x >> bit) & ((1 << n) - 1)

    table_log = peek(4) + 5
    bit = 4
    if table_log > _FSE_MAX_LOG:
        raise Huff0Error(f"weights table log {table_log} > {_FSE_MAX_LOG}")
    remaining = (1 << table_log) + 1
    threshold = 1 << table_log
    nb = table_log + 1
    norm: list[int] = []
    prev0 = False
    while remaining > 1 and len(norm) <= max_symbol:
        if prev0:
            n0 = len(norm)
            while peek(2) == 3:
                n0 += 3
                bit += 2
            n0 += peek(2)
            bit += 2
            if n0 > max_symbol + 1:
                raise Huff0Error("too many zero counts")
            norm.extend([0] * (n0 - len(norm)))
            if len(norm) > max_symbol:
                break
        mx = (2 * threshold - 1) - remaining
        if peek(nb - 1) < mx:
            count = peek(nb - 1)
            bit += nb - 1
        else:
            count = peek(nb)
            if count >= threshold:
                count -= mx
            bit += nb
        count -= 1
        remaining -= -count if count < 0 else count
        norm.append(count)
        prev0 = count == 0
        while remaining < threshold:
            nb -= 1
            threshold >>= 1
        if bit > limit:
            raise Huff0Error("truncated FSE table description")
    if remaining != 1:
        raise Huff0Error("FSE counts do not add up")
    return norm, table_log, (bit + 7) >> 3


def _fse_table(norm: "list[int]", table_log: int):
    size = 1 << table_log
    sym = [0] * size
    high = size - 1
    nxt = [0] * len(norm)
    for s, c in enumerate(norm):
        if c == -1:
            sym[high] = s
            high -= 1
            nxt[s] = 1
        else:
            nxt[s] = c
    step = (size >> 1) + (size >> 3) + 3
    pos = 0
    for s, c in enumerate(norm):
        for _ in range(max(c, 0)):
            sym[pos] = s
            pos = (pos + step) & (size - 1)
            while pos > high:
                pos = (pos + step) & (size - 1)
    if pos != 0:
        raise Huff0Error("FSE table spread does not close")
    table = []
    for u in range(size):
        s = sym[u]
        ns = nxt[s]
        nxt[s] += 1
        nbits = table_log - _highbit(ns)
        table.append((s, nbits, (ns << nbits) - size))
    return table


def _fse_weights(data: bytes) -> "list[int]":
    norm, log, used = _read_ncount(data, 15)
    table = _fse_table(norm, log)
    br = _BackwardBits(data[used:])
    s1, s2 = br.read(log), br.read(log)
    out: list[int] = []
    states = [s1, s2]
    i = 0
    while True:
        if len(out) > 254:
            raise Huff0Error("too many weights")
        sym, nbits, base = table[states[i]]
        out.append(sym)
        states[i] = base + br.read(nbits)
        if br.pos < 0:
            out.append(table[states[1 - i]][0])
            break
        i = 1 - i
    return out


def read_table(block: bytes) -> "tuple[list[tuple[int, int]], int, bytes]":
    """Reads a tree description: returns the decoding table (2^max_bits
    entries of (symbol, bits)), max_bits, and the rest of the block."""
    if not block:
        raise Huff0Error("empty block")
    h = block[0]
    if h >= 128:
        n = h - 127
        raw = block[1:1 + (n + 1) // 2]
        if len(raw) < (n + 1) // 2:
            raise Huff0Error("truncated weights")
        weights = []
        for b in raw:
            weights += [b >> 4, b & 15]
        weights = weights[:n]
        rest = block[1 + (n + 1) // 2:]
    else:
        if len(block) < 1 + h:
            raise Huff0Error("truncated weights")
        weights = _fse_weights(block[1:1 + h])
        rest = block[1 + h:]
    total = 0
    for w in weights:
        if w > _MAX_TABLE_LOG + 1:
            raise Huff0Error(f"weight {w}")
        if w:
            total += 1 << (w - 1)
    if total == 0:
        raise Huff0Error("no weights")
    max_bits = _highbit(total) + 1
    if max_bits > _MAX_TABLE_LOG:
        raise Huff0Error(f"table log {max_bits} > {_MAX_TABLE_LOG}")
    rest_w = (1 << max_bits) - total
    if rest_w & (rest_w - 1):
        raise Huff0Error("weights do not complete a tree")
    weights.append(_highbit(rest_w) + 1)
    table: list[tuple[int, int]] = []
    for w in range(1, max_bits + 1):
        for s, sw in enumerate(weights):
            if sw == w:
                table += [(s, max_bits + 1 - w)] * (1 << (w - 1))
    if len(table) != 1 << max_bits:
        raise Huff0Error("bad weights")
    return table, max_bits, rest


def _decode_stream(data: bytes, n: int, table, max_bits: int, out: bytearray) -> None:
    if not data or data[-1] == 0:
        raise Huff0Error("bitstream without an end marker")
    # buf holds the nbits next bits (most significant first); bytes are
    # loaded from the end of data towards its start.
    nbits = _highbit(data[-1])
    buf = data[-1] & ((1 << nbits) - 1)
    i = len(data) - 2
    mask = (1 << max_bits) - 1
    append = out.append
    for _ in range(n):
        while nbits < max_bits and i >= 0:
            buf = (buf << 8) | data[i]
            i -= 1
            nbits += 8
        if nbits >= max_bits:
            s, nb = table[buf >> (nbits - max_bits)]
        else:
            s, nb = table[(buf << (max_bits - nbits)) & mask]
        if nb > nbits:
            raise Huff0Error("stream ended early")
        append(s)
        nbits -= nb
        buf &= (1 << nbits) - 1
    if nbits != 0 or i >= 0:
        raise Huff0Error(f"{nbits + 8 * (i + 1)} bits left at the end of a stream")


def decompress(block: bytes, n: int, four_streams: bool) -> np.ndarray:
    """Decodes a huff0 block (table included) of n symbols."""
    table, max_bits, data = read_table(block)
    out = bytearray()
    if not four_streams:
        _decode_stream(data, n, table, max_bits, out)
    else:
        if len(data) < 6:
            raise Huff0Error("truncated jump table")
        l1 = int.from_bytes(data[0:2], "little")
        l2 = int.from_bytes(data[2:4], "little")
        l3 = int.from_bytes(data[4:6], "little")
        body = data[6:]
        if l1 + l2 + l3 > len(body):
            raise Huff0Error("jump table outside block")
        seg = (n + 3) // 4
        cuts = [0, l1, l1 + l2, l1 + l2 + l3, len(body)]
        for i in range(4):
            m = seg if i < 3 else n - 3 * seg
            if m < 0:
                raise Huff0Error("block too short for 4 streams")
            _decode_stream(body[cuts[i]:cuts[i + 1]], m, table, max_bits, out)
    if len(out) != n:
        raise Huff0Error(f"decoded {len(out)} symbols, want {n}")
    return np.frombuffer(bytes(out), dtype=np.uint8)
