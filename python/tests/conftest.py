"""Shared fixtures: paths of the repository, the kvmeshd binary and a
cluster of real kvmeshd processes (see harness.py)."""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Three kvmeshd nodes on loopback for the whole session."""
    import harness
    import kvmesh

    c = harness.Cluster(tmp_path_factory.mktemp("cluster"), 3)
    try:
        # The ring forms once the three have joined and raft has a leader.
        def formed():
            with kvmesh.Client(c.seeds, deadline=5) as cl:
                info = cl.cluster_info()
                return len(info.members) == 3 and info.leader_id
        harness.wait_for(formed, 60, "a 3-node ring")
        # R = 2 of 3 nodes, so that routing picks a proper subset.
        from kvmesh._pb import admin_pb2, admin_pb2_grpc
        import grpc
        with grpc.insecure_channel(c.seeds[0]) as ch:
            admin_pb2_grpc.AdminStub(ch).SetSettings(
                admin_pb2.SetSettingsRequest(replication_factor=2, write_quorum=2), timeout=10)
        harness.wait_for(lambda: all(kvmesh.Client([s]).settings().replication_factor == 2 for s in c.seeds),
                         30, "R = 2 on every node")
        yield c
    finally:
        c.stop()


@pytest.fixture
def client(cluster):
    import kvmesh

    with kvmesh.Client(cluster.seeds, deadline=20) as c:
        yield c
