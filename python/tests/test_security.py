"""The client against a node with mutual TLS and API tokens (certificates
from `kvmesh certs`, a token record from `kvmesh token create -records`):
calls succeed with both, and a refused token is a PermissionDenied with a
clear message."""

import subprocess

import numpy as np
import pytest

import harness
import kvmesh
from kvmesh import Entry, Key, TLSConfig
from kvmesh.keys import DType, ModelSpec, RopeStyle


def kvmesh_cli(*args) -> str:
    return subprocess.run([harness.binary("kvmesh"), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    d = tmp_path_factory.mktemp("secure")
    pki = d / "pki"
    kvmesh_cli("certs", "-dir", str(pki), "-node", "n1=127.0.0.1", "-client", "py")
    records = d / "tokens.jsonl"
    token = kvmesh_cli("token", "create", "-records", str(records), "-name", "py",
                       "-scopes", "read,write,admin").strip().splitlines()[-1]
    reader = kvmesh_cli("token", "create", "-records", str(records), "-name", "reader", "-scopes", "read").strip()
    c = harness.Cluster(d, 1, ["-tls-ca", str(pki / "ca.pem"), "-tls-cert", str(pki / "n1.pem"),
                               "-tls-key", str(pki / "n1-key.pem"), "-tokens", "-tokens-file", str(records)])
    tls = TLSConfig(str(pki / "ca.pem"), str(pki / "py.pem"), str(pki / "py-key.pem"))
    try:
        def ready():
            with kvmesh.Client(c.seeds, tls=tls, token=token, deadline=5) as cl:
                return cl.cluster_info().leader_id
        harness.wait_for(ready, 60, "the secure node")
        yield c, tls, token, reader.splitlines()[-1]
    finally:
        c.stop()


def test_tls_and_token(secure):
    c, tls, token, _ = secure
    spec = ModelSpec("llama", 1, 1, 4, DType.F32, RopeStyle.NEOX, 10000, salt="secure")
    with kvmesh.Client(c.seeds, tls=tls, token=token) as cl:
        fp = cl.register_model(spec)
        e = Entry.from_kv(Key(fp, kvmesh.content_id(fp, [1, 2]), kvmesh.standalone_context()), [1, 2],
                          np.ones((1, 2, 2, 1, 4), np.float32))
        cl.put(e)
        assert np.array_equal(cl.get_entry(e.key).kv, e.kv)
        assert cl.settings().replication_factor >= 1


def test_refused_tokens(secure):
    c, tls, _, reader = secure
    with pytest.raises(kvmesh.PermissionDenied, match="refused") as ei:
        kvmesh.Client(c.seeds, tls=tls, token="0123456789abcdef.not-the-secret")
    assert "grpc" not in str(ei.value).lower() and "Traceback" not in str(ei.value)
    with pytest.raises(kvmesh.PermissionDenied, match="refused"):
        kvmesh.Client(c.seeds, tls=tls)  # no token at all
    # A read-only token may read, not register a model.
    with kvmesh.Client(c.seeds, tls=tls, token=reader) as cl:
        cl.cluster_info()
        with pytest.raises(kvmesh.PermissionDenied, match="refused"):
            cl.register_model(ModelSpec("llama", 1, 1, 4, DType.F32, RopeStyle.NEOX, 10000, salt="not allowed"))


def test_token_needs_tls(secure):
    c, _, token, _ = secure
    with pytest.raises(ValueError, match="without TLS"):
        kvmesh.Client(c.seeds, token=token)
