"""The in-tree build backend makes a wheel of the whole package with the
metadata of pyproject.toml, with nothing else installed (so `pip install
./python` works offline)."""

import importlib.util
import shutil
import subprocess
import zipfile

import pytest

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


def test_generated_code_is_current(tmp_path):
    """python/kvmesh/_pb is what python/gen.sh makes of api/*.proto now."""
    if not shutil.which("protoc") or not shutil.which("grpc_python_plugin"):
        pytest.skip("protoc or grpc_python_plugin missing (apt-get install protobuf-compiler protobuf-compiler-grpc)")
    subprocess.run([str(ROOT / "python" / "gen.sh"), str(tmp_path)], check=True, capture_output=True)
    committed = ROOT / "python" / "kvmesh" / "_pb"
    made = sorted(p.name for p in tmp_path.glob("*_pb2*.py"))
    assert made == sorted(p.name for p in committed.glob("*_pb2*.py"))
    for name in made:
        assert (tmp_path / name).read_text() == (committed / name).read_text(), f"{name} is stale: run make proto"
