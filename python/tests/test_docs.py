"""The quick start of docs/PYTHON.md runs as written, against the test
cluster."""

import re

from conftest import ROOT


def test_quick_start(cluster, monkeypatch, capsys):
    doc = (ROOT / "docs" / "PYTHON.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    monkeypatch.setenv("KVMESH_ADDR", ",".join(cluster.seeds))
    exec(compile(code, "docs/PYTHON.md", "exec"), {})
    out = capsys.readouterr().out
    assert "['MISS', 'EXACT']" in out
