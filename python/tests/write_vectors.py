"""Writes the Python-written entries of the shared vectors
(chunk/testdata/vectors/py_*.kvmc and their records in vectors.json), which
Go's TestSharedVectors decodes. Run from the repository root:
    /usr/bin/python3 python/tests/write_vectors.py
"""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from kvmesh import entry as entrylib  # noqa: E402
from kvmesh.keys import xxh64  # noqa: E402

VEC = ROOT / "chunk" / "testdata" / "vectors"
SOURCES = ["go_2_bf16_raw.kvmc", "go_5_f16_raw.kvmc", "go_0_f32_raw.kvmc"]


def main():
    path = VEC / "vectors.json"
    v = json.loads(path.read_text())
    v["entries"] = [e for e in v["entries"] if e["writer"] != "python"]
    for src in SOURCES:
        e = entrylib.decode((VEC / src).read_bytes())
        blob = entrylib.encode(e, "lossless")
        name = src.replace("go_", "py_").replace("_raw", "_lossless")
        (VEC / name).write_bytes(blob)
        hd = entrylib.parse_header(blob)
        c = e.key.context
        v["entries"].append({
            "file": name, "codec": "lossless", "dtype": e.dtype.name.lower(), "tokens": e.tokens.tolist(),
            "layers": e.kv.shape[0], "kv_heads": e.kv.shape[3], "head_dim": e.kv.shape[4],
            "fingerprint": str(e.key.fingerprint), "content": str(e.key.content), "context_kind": int(c.kind),
            "context_window": c.window, "context_id": str(c.id), "kv_xxh64": f"{xxh64(e.kv.tobytes()):016x}",
            "checksum": f"{hd.checksum:016x}", "writer": "python"})
    path.write_text(json.dumps(v, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
