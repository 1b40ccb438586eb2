"""The client against three real kvmeshd processes: every call, routing by
placement, lookups, ranges, failover, and the errors a user sees."""

import numpy as np
import pytest

import harness
import kvmesh
from kvmesh import Codec, Context, Entry, Key, LookupItem, Match, ModelSpec, Range
from kvmesh.keys import DType, RopeStyle

SPEC = ModelSpec("llama", layers=3, kv_heads=4, head_dim=8, dtype=DType.F16, rope_style=RopeStyle.NEOX,
                 rope_theta=10000, tokenizer_id="python-client-test")


def make_entry(fp, tokens, context=None, seed=0, dtype=np.float16):
    rng = np.random.default_rng(seed)
    kv = rng.standard_normal((SPEC.layers, 2, len(tokens), SPEC.kv_heads, SPEC.head_dim)).astype(dtype)
    content = kvmesh.content_id(fp, tokens)
    return Entry.from_kv(Key(fp, content, context or kvmesh.standalone_context()), tokens, kv)


@pytest.fixture(scope="module")
def fp(cluster):
    with kvmesh.Client(cluster.seeds) as c:
        return c.register_model(SPEC)


def test_cluster_info_and_settings(client, cluster):
    info = client.cluster_info()
    assert sorted(m.id for m in info.members) == ["n1", "n2", "n3"]
    assert {m.grpc_addr for m in info.members} == set(cluster.seeds)
    assert info.replication_factor >= 1 and info.leader_id in ("n1", "n2", "n3")
    assert len(client.ring) == 3 and client.ring.epoch == info.epoch
    for m in info.members:
        assert client.stats(m.grpc_addr).node_id == m.id
    s = client.settings()
    assert (s.replication_factor, s.write_quorum, s.codec) == (info.replication_factor, info.write_quorum, info.codec)


def test_models(client, fp):
    assert fp == SPEC.fingerprint()
    assert SPEC in client.models()


def test_put_get_delete_roundtrip(client, fp):
    tokens = list(range(100, 132))
    e = make_entry(fp, tokens)
    res = client.put(e, codec=Codec.LOSSLESS)
    want = [m.id for m in client.ring.replicas(e.key.content, client.replication_factor)]
    # Placement: the entry landed on exactly the replicas Python computes.
    assert sorted(res.stored_on) == sorted(want)
    blob = client.get(e.key)
    assert kvmesh.verify(blob).checksum == res.checksum
    got = client.get_entry(e.key)
    assert got.tokens.tolist() == tokens and np.array_equal(got.kv, e.kv)
    # A layer and head range, decoded by the node.
    r = client.get_range(e.key, Range(1, 3, 2, 4))
    assert r.range == Range(1, 3, 2, 4) and r.kv.dtype == np.float16
    assert np.array_equal(r.kv, e.kv[1:3, :, :, 2:4])
    assert np.array_equal(client.get_range(e.key).kv, e.kv)
    assert client.delete(e.key) >= 1
    with pytest.raises(kvmesh.NotFound, match="not found"):
        client.get(e.key)


def test_put_other_bytes_already_stored(client, fp):
    # Two honest producers of one chunk: the same key, other KV bytes. The
    # second put is not an error; its reply says which version is kept
    # (the smaller checksum), whichever came first.
    tokens = list(range(300, 310))
    a, b = make_entry(fp, tokens, seed=1), make_entry(fp, tokens, seed=2)
    blobs = sorted((kvmesh.encode(e, Codec.LOSSLESS) for e in (a, b)), key=lambda x: kvmesh.verify(x).checksum)
    small, big = (kvmesh.verify(x).checksum for x in blobs)
    first = client.put(blobs[0])
    assert (first.already_stored, first.checksum, first.kept_checksum) == (False, small, small)
    second = client.put(blobs[1])
    assert (second.already_stored, second.checksum, second.kept_checksum) == (True, big, small)
    assert client.get(a.key) == blobs[0]
    client.delete(a.key)


def test_lookup_exact_approximate_miss(client, fp):
    chunks = [list(range(i * 16, i * 16 + 16)) for i in range(3)]
    ctxs, _ = kvmesh.prefix_chain(fp, chunks)
    client.put(make_entry(fp, chunks[0], ctxs[0]))  # stored after its prefix: EXACT
    client.put(make_entry(fp, chunks[1], kvmesh.standalone_context()))  # another encoding: APPROXIMATE
    items = [LookupItem(kvmesh.content_id(fp, c), x) for c, x in zip(chunks, ctxs)]
    res = client.lookup(fp, items)
    assert [r.match for r in res] == [Match.EXACT, Match.APPROXIMATE, Match.MISS]
    assert res[0].key.context == ctxs[0] and res[1].key.context == kvmesh.standalone_context()
    assert res[2].key is None
    owners = [m.id for m in client.ring.replicas(items[0].content, client.replication_factor)]
    assert sorted(h.id for h in res[0].holders) == sorted(owners)


@pytest.mark.parametrize("batch", [4096, 7])
def test_lookup_batches_across_replica_sets(client, fp, monkeypatch, batch):
    # A small batch size makes each replica set's items span several calls.
    monkeypatch.setattr(kvmesh.client, "MAX_LOOKUP_BATCH", batch)
    stored = [make_entry(fp, [7000 + i, i], seed=i) for i in range(24)]
    for e in stored:
        client.put(e)
    items = [LookupItem(e.key.content, kvmesh.standalone_context()) for e in stored]
    items += [LookupItem(kvmesh.content_id(fp, [9, i, 9]), kvmesh.standalone_context()) for i in range(200)]
    res = client.lookup(fp, items)
    assert [r.match for r in res[:24]] == [Match.EXACT] * 24
    assert all(r.match == Match.MISS for r in res[24:])


def test_deadline(client, fp):
    e = make_entry(fp, [31337])
    with pytest.raises(kvmesh.DeadlineExceeded, match="deadline exceeded"):
        client.get(e.key, timeout=1e-6)


def test_unknown_model_is_a_clear_error(client):
    other = ModelSpec("llama", 2, 1, 4, DType.F32, RopeStyle.NEOX, 10000, salt="never registered")
    e = Entry.from_kv(Key(other.fingerprint(), kvmesh.content_id(other.fingerprint(), [1]),
                          kvmesh.standalone_context()), [1], np.zeros((2, 2, 1, 1, 4), np.float32))
    with pytest.raises(kvmesh.UnknownModel, match="unknown model fingerprint") as ei:
        client.put(e)
    assert "Traceback" not in str(ei.value) and "grpc" not in str(ei.value).lower()


@pytest.fixture
def own_cluster(tmp_path):
    """A cluster of its own, for a test that kills nodes (R = 2, W = 1)."""
    from conftest import start_cluster
    c = start_cluster(tmp_path, 3, replication=2, quorum=1)
    yield c
    c.stop()


def test_node_down_fails_over(own_cluster):
    """Kills the owner of a chunk: the client reads it from the next
    replica and still writes (W = 1); with every seed dead it says no node
    answered."""
    cluster = own_cluster
    with kvmesh.Client(cluster.seeds, deadline=20, rpc_timeout=3) as c:
        fp = c.register_model(SPEC)
        e = make_entry(fp, [424242, 1, 2, 3])
        c.put(e)
        # W = 1 acknowledges the first copy; the second may still be on its
        # way. This test is about reading from the other replica, so it
        # waits for that copy before the kill.
        replicas = {m.id for m in c.ring.replicas(e.key.content, c.replication_factor)}
        item = LookupItem(e.key.content, kvmesh.standalone_context())
        harness.wait_for(lambda: {h.id for h in c.lookup(fp, [item])[0].holders} >= replicas, 30,
                         "the entry on both replicas")
        owner = c.ring.owner(e.key.content)
        node = next(n for n in cluster.nodes if n.id == owner.id)
        node.kill()
        assert np.array_equal(c.get_entry(e.key).kv, e.kv)
        e2 = make_entry(fp, [424242, 4, 5, 6])
        assert c.put(e2).stored_on
    with pytest.raises(kvmesh.NoNodes, match="no cluster node answered"):
        kvmesh.Client([node.grpc], deadline=2, rpc_timeout=0.5)
