"""Shared fixtures: paths of the repository, the kvmeshd binary and a
cluster of real kvmeshd processes (see harness.py)."""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def start_cluster(base, n=3, replication=2, quorum=2, extra=None):
    """n kvmeshd nodes on loopback that form one ring, with the settings
    R = replication, W = quorum (R < n makes routing pick a proper
    subset) and kvmeshd's further flags extra. The caller stops it."""
    import grpc
    import harness
    import kvmesh
    from kvmesh._pb import admin_pb2, admin_pb2_grpc

    c = harness.Cluster(base, n, extra)
    try:
        def formed():
            with kvmesh.Client(c.seeds, deadline=5) as cl:
                info = cl.cluster_info()
                return len(info.members) == n and info.leader_id
        harness.wait_for(formed, 60, f"a {n}-node ring")
        with grpc.insecure_channel(c.seeds[0]) as ch:
            admin_pb2_grpc.AdminStub(ch).SetSettings(
                admin_pb2.SetSettingsRequest(replication_factor=replication, write_quorum=quorum), timeout=10)

        def applied():
            for s in c.seeds:
                with kvmesh.Client([s], deadline=5) as cl:
                    if cl.settings().replication_factor != replication:
                        return False
            return True
        harness.wait_for(applied, 30, f"R = {replication} on every node")
        return c
    except BaseException:
        c.stop()
        raise


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Three kvmeshd nodes on loopback for the whole session (R = 2, W = 2);
    no test stops its nodes."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def client(cluster):
    import kvmesh

    with kvmesh.Client(cluster.seeds, deadline=20) as c:
        yield c
