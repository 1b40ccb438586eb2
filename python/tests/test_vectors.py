"""The shared vectors: every key, entry byte and placement that Go's tests
pin (chunk/testdata/vectors, ring/testdata/placement_vectors.json) and the
vectors printed in docs/KEYS.md."""

import json
import re
import struct

import numpy as np
import pytest
from conftest import ROOT

import kvmesh
from kvmesh import entry as entrylib
from kvmesh.keys import ID, Context, ContextKind, DType, Key, ModelSpec, RopeScaling, RopeStyle, xxh64
from kvmesh.placement import Member, Ring, det_log

VEC = ROOT / "chunk" / "testdata" / "vectors"


def load():
    return json.loads((VEC / "vectors.json").read_text())


def spec_of(j) -> ModelSpec:
    sc = j["Scaling"]
    return ModelSpec(family=j["Family"], layers=j["Layers"], kv_heads=j["KVHeads"], head_dim=j["HeadDim"],
                     dtype=DType(j["DType"]), rope_style=RopeStyle(j["RopeStyle"]), rope_theta=j["RopeTheta"],
                     rotary_dim=j["RotaryDim"],
                     scaling=RopeScaling(type=sc["Type"], factor=sc["Factor"], low_freq_factor=sc["LowFreqFactor"],
                                         high_freq_factor=sc["HighFreqFactor"],
                                         original_max_positions=sc["OriginalMaxPositions"],
                                         beta_fast=sc["BetaFast"], beta_slow=sc["BetaSlow"],
                                         attention_factor=sc["AttentionFactor"], max_positions=sc["MaxPositions"]),
                     weights_revision=j["WeightsRevision"], tokenizer_id=j["TokenizerID"], salt=j["Salt"])


def test_keys_md_vectors():
    """The table of docs/KEYS.md section 5, read from the document."""
    doc = (ROOT / "docs" / "KEYS.md").read_text()
    tiny = ModelSpec("qwen2", 2, 1, 4, DType.F16, RopeStyle.GPTJ, 10000, rotary_dim=2, salt="tenant-a")
    llama = ModelSpec("llama", 32, 8, 128, DType.BF16, RopeStyle.NEOX, 500000,
                      scaling=RopeScaling("llama3", 8, 1, 4, 8192),
                      weights_revision="meta-llama/Llama-3.1-8B-Instruct@0e9e39f",
                      tokenizer_id="meta-llama/Llama-3.1-8B-Instruct")
    block = re.search(r"CanonicalEncoding\(tiny\), 140 bytes.*?```\n(.*?)```", doc, re.S).group(1)
    assert tiny.canonical_encoding().hex() == "".join(block.split())
    assert len(llama.canonical_encoding()) == 203
    table = dict(re.findall(r"^\| (.+?) \| `([0-9a-f]{32})` \|$", doc, re.M))
    fp = llama.fingerprint()
    t300 = [(i * 2654435761) % (1 << 32) for i in range(300)]
    got = {
        "Fingerprint(tiny)": tiny.fingerprint(),
        "Fingerprint(llama) = fp": fp,
        "ContentID(fp, [])": kvmesh.content_id(fp, []),
        "ContentID(fp, [128000, 9906, 1917, 0, 4294967295])": kvmesh.content_id(fp, [128000, 9906, 1917, 0, 4294967295]),
        "ContentID(fp, t300), t300[i] = i*2654435761 mod 2^32, i < 300": kvmesh.content_id(fp, t300),
        "WindowID(fp, [11, 12, 13, 14]) (w = 4)": kvmesh.window_id(fp, [11, 12, 13, 14]),
        "WindowID(fp, [7, 8, 9]) (w = 20, near the prompt start)": kvmesh.window_id(fp, [7, 8, 9]),
        "PrefixRoot(fp) (seeds the chain; chunk 0's context is standalone)": kvmesh.prefix_root(fp),
    }
    ctxs, end = kvmesh.prefix_chain(fp, [[128000, 882, 25], [9906, 1917], [0, 1, 2, 3, 4]])
    got["after [128000, 882, 25] = context of chunk 1"] = ctxs[1].id
    got["after [9906, 1917] = context of chunk 2"] = ctxs[2].id
    got["after [0, 1, 2, 3, 4] (chain end)"] = end
    # The Redis door's opaque keyspace (chunk/opaque.go): the fingerprint of
    # OpaqueSpec("resp:") and a key's content ID in the opaque domain.
    ofp = ModelSpec("kvmesh-opaque", 1, 1, 256, DType.BF16, RopeStyle.NEOX, 10000, salt="resp:").fingerprint()
    got['Fingerprint(OpaqueSpec("resp:")) = ofp (the door\'s keyspace without tokens)'] = ofp
    got['OpaqueID(ofp, "k")'] = ID(xxh64(b"k", ofp.lo ^ 0x6F70617175652E2E), xxh64(b"k", ofp.hi ^ 0x2E2E6F7061717565))
    assert set(got) == set(table), set(table) ^ set(got)
    for what, want in table.items():
        assert str(got[what]) == want, what
    assert xxh64(b"", 0) == 0xEF46DB3751D8E999


def test_go_specs_and_ids():
    v = load()
    fps = {}
    for sv in v["specs"]:
        s = spec_of(sv["spec"])
        s.validate()
        assert s.canonical_encoding().hex() == sv["canonical_hex"], sv["name"]
        assert str(s.fingerprint()) == sv["fingerprint"], sv["name"]
        fps[sv["name"]] = s.fingerprint()
    assert v["ids"]
    for iv in v["ids"]:
        fp = fps[iv["spec"]]
        if iv["what"] == "content":
            got = [kvmesh.content_id(fp, iv.get("tokens") or [])]
        elif iv["what"] == "window":
            got = [kvmesh.window_id(fp, iv.get("tokens") or [])]
        elif iv["what"] == "prefix_chain":
            ctxs, end = kvmesh.prefix_chain(fp, iv["chunks"])
            got = [c.id for c in ctxs] + [end]
            assert [str(c) for c in ctxs] == iv["contexts"], iv
        elif iv["what"] == "canonical":
            c = iv["context"]
            got = [kvmesh.keys.canonical(fp, Context(ContextKind(c["kind"]), c["window"], ID.parse(c["id"])))]
            assert [str(g) for g in got] == iv["contexts"], iv
            continue
        elif iv["what"] == "window_or_prefix":
            got = [kvmesh.keys.window_or_prefix(fp, iv.get("w", 0), iv.get("chunks") or [])]
            assert [str(g) for g in got] == iv["contexts"], iv
            continue
        else:
            raise AssertionError(f"unknown id vector {iv['what']!r}")
        assert [str(g) for g in got] == iv["ids"], iv


def entry_cases():
    return [pytest.param(ev, id=ev["file"]) for ev in load()["entries"]]


@pytest.mark.parametrize("ev", entry_cases())
def test_go_entries(ev):
    blob = (VEC / ev["file"]).read_bytes()
    e = entrylib.decode(blob)
    hd = entrylib.parse_header(blob)
    assert hd.codec.name.lower() == ev["codec"]
    assert e.dtype.name.lower() == ev["dtype"]
    assert e.tokens.tolist() == ev["tokens"]
    assert e.kv.shape == (ev["layers"], 2, len(ev["tokens"]), ev["kv_heads"], ev["head_dim"])
    assert str(e.key.fingerprint) == ev["fingerprint"] and str(e.key.content) == ev["content"]
    assert (int(e.key.context.kind), e.key.context.window, str(e.key.context.id)) == (
        ev["context_kind"], ev["context_window"], ev["context_id"])
    assert f"{xxh64(e.kv.tobytes()):016x}" == ev["kv_xxh64"]
    assert f"{hd.checksum:016x}" == ev["checksum"]
    if ev["codec"] == "raw" or ev["writer"] == "python":
        # Raw: byte-identical to Go. Lossless: Python's own encoding (Go's
        # huff0 planes are not reproduced), which Go's test decodes.
        assert entrylib.encode(e, ev["codec"]) == blob
    # Python's lossless encoding decodes to the same tensor.
    assert np.array_equal(entrylib.decode(entrylib.encode(e, "lossless")).kv, e.kv)
    # A layer and head range equals the slice of the whole.
    L, H = e.kv.shape[0], e.kv.shape[3]
    _, part = entrylib.decode_range(blob, entrylib.Range(L - 1, L, H - 1, H))
    assert np.array_equal(part, e.kv[L - 1:L, :, :, H - 1:H])


def test_corrupt_entries_are_refused():
    blob = bytearray((VEC / "go_0_f32_raw.kvmc").read_bytes())
    for i in (0, 5, 70, len(blob) - 1):
        bad = bytearray(blob)
        bad[i] ^= 1
        with pytest.raises(kvmesh.EntryError):
            entrylib.decode(bytes(bad))
    with pytest.raises(kvmesh.CorruptEntry):
        entrylib.decode(bytes(blob[:-1]))
    with pytest.raises(kvmesh.EntryError):
        entrylib.decode(bytes(blob), entrylib.Limits(max_tokens=2))


def test_f16_exponent_layout():
    """An f16 lossless layer in the exponent layout (Go's encoders write it)
    decodes bit for bit; an exponent over 31 or a bit past the block's end
    is refused, as in Go."""
    rng = np.random.default_rng(7)
    m = 37  # elements per half: two groups of 16 and a tail of 5
    u = rng.integers(0, 1 << 16, size=2 * m, dtype=np.uint16)

    def layer(u, exp_over=None, past=False):
        out = bytearray([0x10])
        for h in (u[:m], u[m:]):
            exp = ((h >> 10) & 0x1F).astype(np.uint8)
            if exp_over is not None:
                exp[exp_over] = 32
            words = np.zeros((3, 3), dtype="<u2")
            for j, x in enumerate(h):
                for w, b in enumerate((15, 9, 8)):
                    words[j >> 4, w] |= ((int(x) >> b) & 1) << (j & 15)
            if past:
                words[2, 0] |= 1 << 15
            for plane in (exp.tobytes(), (h & 0xFF).astype(np.uint8).tobytes(), words.tobytes()):
                out += struct.pack("<BI", 0, len(plane)) + plane
        return memoryview(bytes(out))

    s = entrylib.Shape(DType.F16, m, 1, 1, 1)
    assert np.array_equal(np.frombuffer(entrylib._lossless_decode(layer(u), s), dtype="<u2"), u)
    for bad in (layer(u, exp_over=3), layer(u, exp_over=m - 1), layer(u, past=True)):
        with pytest.raises(kvmesh.CorruptEntry):
            entrylib._lossless_decode(bad, s)


def test_placement_vectors():
    v = json.loads((ROOT / "ring" / "testdata" / "placement_vectors.json").read_text())
    assert v["rings"]
    for rv in v["rings"]:
        ms = [Member(m["id"], weight=struct.unpack("<d", int(m["weight_bits"], 16).to_bytes(8, "little"))[0])
              for m in rv["members"]]
        ring = Ring(1, ms)
        for k in rv["keys"]:
            got = [m.id for m in ring.replicas(ID.parse(k["content"]), rv["r"])]
            assert got == k["replicas"], (rv["name"], k["content"])


def test_det_log_close_to_math_log():
    import math
    rng = np.random.default_rng(1)
    for u in rng.random(1000):
        u = float(u) or 0.5
        assert abs(det_log(u) - math.log(u)) <= math.ulp(math.log(u))  # < 1 ulp, as Go's math.Log


def spec_check_cases():
    return [pytest.param(sc, id=sc["name"]) for sc in load()["spec_checks"]]


@pytest.mark.parametrize("sc", spec_check_cases())
def test_spec_checks(sc):
    """One model, one fingerprint: validate accepts and refuses exactly what
    Go's Validate does (unused scaling fields, integer ranges, string
    limits), and -0.0 fingerprints as 0.0."""
    import dataclasses
    s = spec_of(sc["spec"])
    names = {"Factor": "factor", "BetaFast": "beta_fast", "AttentionFactor": "attention_factor"}
    if sc.get("negative_zero"):
        s = dataclasses.replace(s, scaling=dataclasses.replace(
            s.scaling, **{names[n]: -0.0 for n in sc["negative_zero"]}))
    if sc["valid"]:
        s.validate()
        assert str(s.fingerprint()) == sc["fingerprint"]
    else:
        with pytest.raises(ValueError, match="invalid model spec"):
            s.validate()


@pytest.mark.parametrize("change,reason", [
    (dict(family=""), "family is empty"),
    (dict(layers=0), "layers 0"),
    (dict(head_dim=7), "head dim 7"),
    (dict(rope_theta=1.0), "rope theta"),
    (dict(rotary_dim=6, head_dim=4), "rotary dim"),
    (dict(scaling=RopeScaling("llama3", 8, 4, 1, 8192)), "llama3 scaling"),
    (dict(scaling=RopeScaling("ntk")), "unknown rope scaling"),
    (dict(scaling=RopeScaling("llama3", 8, 1, 4, 8192, beta_fast=32)), "does not use beta_fast"),
    (dict(scaling=RopeScaling("default", 8)), "does not use factor"),
    (dict(scaling=RopeScaling("llama3", 8, 1, 4, (1 << 32) + 8192)), "out of range"),
    (dict(salt="x" * 257), "salt"),
    (dict(layers=1.5), "not an integer"),
])
def test_spec_validate(change, reason):
    import dataclasses
    ok = ModelSpec("llama", 2, 2, 8, DType.F16, RopeStyle.NEOX, 10000)
    ok.validate()
    with pytest.raises(ValueError, match=reason):
        dataclasses.replace(ok, **change).validate()
