"""A minimal PEP 517 build backend for the kvmesh package: it writes a
pure-Python wheel of kvmesh/ with the metadata of pyproject.toml. It needs
no other package, so pip builds offline (Debian's pip has no setuptools to
offer its isolated build environment)."""

import base64
import hashlib
import io
import os
import pathlib
import tarfile
import tomllib
import zipfile

HERE = pathlib.Path(__file__).resolve().parent.parent
_PROJECT = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
NAME, VERSION = _PROJECT["name"], _PROJECT["version"]
TAG = "py3-none-any"


def _metadata() -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {VERSION}", f"Summary: {_PROJECT['description']}",
             f"Requires-Python: {_PROJECT['requires-python']}"]
    lines += [f"Requires-Dist: {r}" for r in _PROJECT["dependencies"]]
    for extra, reqs in _PROJECT.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    return "\n".join(lines) + "\n"


def _files():
    for p in sorted((HERE / NAME).rglob("*.py")):
        if "__pycache__" not in p.parts:
            yield p, p.relative_to(HERE).as_posix()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, extra=()):
    dist = f"{NAME}-{VERSION}.dist-info"
    fname = f"{NAME}-{VERSION}-{TAG}.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w", zipfile.ZIP_DEFLATED) as z:
        def add(name, data):
            z.writestr(name, data)
            records.append(_record_line(name, data))
        for p, rel in _files():
            add(rel, p.read_bytes())
        for name, data in extra:
            add(name, data)
        add(f"{dist}/METADATA", _metadata().encode())
        add(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: kvmesh-backend\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode())
        add(f"{dist}/top_level.txt", f"{NAME}\n".encode())
        records.append(f"{dist}/RECORD,,")
        z.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    return fname


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source directory on sys.path.
    return _write_wheel_pth(wheel_directory)


def _write_wheel_pth(wheel_directory):
    dist = f"{NAME}-{VERSION}.dist-info"
    fname = f"{NAME}-{VERSION}-{TAG}.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w") as z:
        for name, data in ((f"__editable__.{NAME}.pth", (str(HERE) + "\n").encode()),
                           (f"{dist}/METADATA", _metadata().encode()),
                           (f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: kvmesh-backend\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode())):
            z.writestr(name, data)
            records.append(_record_line(name, data))
        records.append(f"{dist}/RECORD,,")
        z.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    return fname


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    fname = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, fname), "w:gz") as t:
        for p in [HERE / "pyproject.toml", HERE / "_build" / "backend.py"] + [p for p, _ in _files()]:
            t.add(p, arcname=f"{base}/{p.relative_to(HERE).as_posix()}")
        info = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(info)
        t.addfile(ti, io.BytesIO(info))
    return fname
