"""The in-tree build backend makes a wheel of the whole package with the
metadata of pyproject.toml, with nothing else installed (so `pip install
./python` works offline)."""

import importlib.util
import zipfile

from conftest import ROOT


def test_wheel(tmp_path):
    spec = importlib.util.spec_from_file_location("backend", ROOT / "python" / "_build" / "backend.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    assert backend.get_requires_for_build_wheel() == []
    name = backend.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        meta = z.read(f"kvmesh-{backend.VERSION}.dist-info/METADATA").decode()
    sources = {p.relative_to(ROOT / "python").as_posix() for p in (ROOT / "python" / "kvmesh").rglob("*.py")}
    assert sources <= names and "kvmesh/_pb/kvmesh_pb2_grpc.py" in names
    assert "Requires-Dist: grpcio" in meta and 'Requires-Dist: torch; extra == "torch"' in meta
