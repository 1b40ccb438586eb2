"""The Redis-protocol door (kvmeshd -resp, docs/REDIS.md) through
python3-redis, Debian's Redis client, against three real kvmeshd
processes: one is killed with SIGKILL while clients write, and every SET
that was acknowledged reads back byte-identical from the others."""

import random
import threading
import time

import pytest

import harness
from conftest import start_cluster

redis = pytest.importorskip("redis", reason="python3-redis missing (make python-deps installs it)")


def door(node, **kw):
    host, port = node.addrs["resp"].rsplit(":", 1)
    kw.setdefault("socket_timeout", 30)
    return redis.Redis(host=host, port=int(port), **kw)


@pytest.fixture
def resp_cluster(tmp_path):
    # R = 3, W = 2: an acknowledged SET is on two nodes at least, so it
    # outlives any one of them.
    c = start_cluster(tmp_path, n=3, replication=3, quorum=2, extra=["-resp", "127.0.0.1:0", "-rpc-timeout", "3s"])
    yield c
    c.stop()


def test_commands(resp_cluster):
    r = door(resp_cluster.nodes[0])
    assert r.ping()
    assert r.set(b"k\x00\xff", b"") is True
    assert r.get(b"k\x00\xff") == b""
    assert r.get("missing") is None
    value = random.Random(1).randbytes(1 << 20)
    assert r.set("big", value)
    other = door(resp_cluster.nodes[2])
    assert other.get("big") == value
    assert other.strlen("big") == 1 << 20
    assert other.exists("big", "missing", "big") == 2
    assert other.type("big") == b"string"
    assert other.setnx("big", b"x") is False
    assert other.mset({"a": b"1", "b": b"2"})
    assert r.mget("a", "missing", "b") == [b"1", None, b"2"]
    assert r.delete("a", "b", "missing") == 2
    with pytest.raises(redis.ResponseError, match="not supported by kvmesh"):
        r.set("k", b"v", ex=10)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.hget("h", "f")
    assert "redis_version" in r.info()
    # Pipelined commands get their replies in order.
    p = r.pipeline(transaction=False)
    for i in range(200):
        p.set(f"p{i}", f"v{i}")
        p.get(f"p{i}")
    replies = p.execute()
    assert replies == [x for i in range(200) for x in (True, f"v{i}".encode())]


def test_kill_one_node_keeps_acknowledged(resp_cluster):
    nodes = resp_cluster.nodes
    acked = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def writer(w):
        rng = random.Random(w)
        clients = [door(n, socket_timeout=10) for n in nodes]
        i = 0
        while not stop.is_set():
            key = f"w{w}:{i}".encode()
            value = rng.randbytes(rng.choice([0, 1, 100, 4096, 65536, 300_000]))
            c = clients[i % len(clients)]
            i += 1
            try:
                ok = c.set(key, value)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as e:
                errors.append(repr(e))  # not acknowledged: not checked
                continue
            if ok:
                with lock:
                    acked[key] = value

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        harness.wait_for(lambda: len(acked) >= 150, 120, "150 acknowledged SETs")
        victim = nodes[1]
        victim.kill()
        before = len(acked)
        harness.wait_for(lambda: len(acked) >= before + 150, 120, "150 more acknowledged SETs after the kill")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    print(f"acknowledged {len(acked)} SETs, {len(errors)} failed (not acknowledged)")
    survivors = [n for n in nodes if n.alive()]
    assert len(survivors) == 2
    for n in survivors:
        r = door(n)
        p = r.pipeline(transaction=False)
        keys = list(acked)
        for k in keys:
            p.get(k)
        got = p.execute()
        lost = [k for k, v in zip(keys, got) if v != acked[k]]
        assert not lost, f"{len(lost)} of {len(keys)} acknowledged values differ through {n.id}: {lost[:5]}"
