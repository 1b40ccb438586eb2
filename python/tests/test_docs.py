"""Every Python example of docs/PYTHON.md runs as written, against the test
cluster, from the repository root. An example that starts with a
"# python/examples/NAME.py" line is that file, word for word (the file is
what runs); python/examples holds nothing the document does not show."""

import contextlib
import io
import re
import runpy

import pytest

from conftest import ROOT

DOC = (ROOT / "docs" / "PYTHON.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, re.S)


def _name(code):
    m = re.match(r"# (python/examples/\S+\.py)\n", code)
    return m.group(1) if m else None


def test_examples_are_the_files():
    named = {_name(b): b for b in BLOCKS if _name(b)}
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "python" / "examples").glob("*.py")}
    assert set(named) == files
    for name, code in named.items():
        assert code.split("\n", 1)[1] == (ROOT / name).read_text(), f"docs/PYTHON.md's {name} differs from the file"
    rag = (ROOT / "python" / "examples" / "rag.py").read_text().strip().splitlines()
    assert len([line for line in rag if line.strip()]) <= 10


@pytest.mark.parametrize("code", BLOCKS, ids=lambda b: _name(b) or b.split("\n", 1)[0][:40])
def test_example_runs(cluster, monkeypatch, code):
    monkeypatch.setenv("KVMESH_ADDR", ",".join(cluster.seeds))
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        name = _name(code)
        if name:
            runpy.run_path(str(ROOT / name), run_name="__main__")
        else:
            exec(compile(code, "docs/PYTHON.md", "exec"), {})
    text = out.getvalue()
    print(text)
    if name == "python/examples/quickstart.py":
        assert "['MISS', 'EXACT']" in text
    elif name == "python/examples/rag.py":
        got, want = text.strip().split("] [")
        assert got + "]" == "[" + want  # the model's answer is the expected one
    elif name == "python/examples/torch_inject.py":
        matches, diff = text.rsplit(" ", 1)
        assert matches == "['EXACT']" and float(diff) < 1e-4
    elif name == "python/examples/generate.py":
        assert text.startswith("[") and text.strip().endswith("]")
