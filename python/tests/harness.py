"""Starts and stops real kvmeshd processes for the Python suite, as Go's
tests/harness does: each node binds port 0 on loopback, prints
"kvmeshd listening node=ID grpc=... gossip=... raft=... http=..." once it
listens (and the same line starting "kvmeshd ready" once it is ready), and stops on SIGTERM. The binary is $KVMESHD, else bin/kvmeshd of
the repository (make build)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def binary(name: str = "kvmeshd") -> str:
    env = os.environ.get(name.upper())
    p = pathlib.Path(env) if env else ROOT / "bin" / name
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: run `make build` first")
    return str(p)


class Node:
    """One kvmeshd process."""

    def __init__(self, node_id: str, data_dir: pathlib.Path, args: "list[str]", ready_timeout: float = 60):
        self.id = node_id
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{node_id}.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [binary(), "-id", node_id, "-data-dir", str(data_dir), "-grpc", "127.0.0.1:0", "-local-timing",
               "-dram", "64M", "-log-level", "warn"] + args
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        self.addrs: dict = {}
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                f = line.decode(errors="replace").split()
                if len(f) > 2 and f[0] == "kvmeshd" and f[1] == "listening" and not ready.is_set():
                    self.addrs = dict(kv.split("=", 1) for kv in f[2:] if "=" in kv)
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        end = time.monotonic() + ready_timeout
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.kill()
                raise RuntimeError(f"kvmeshd {node_id} did not get ready: {self.log_path}:\n"
                                   + self.log_path.read_text(errors="replace")[-3000:])

    @property
    def grpc(self) -> str:
        return self.addrs["grpc"]

    @property
    def gossip(self) -> str:
        return self.addrs["gossip"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL after timeout."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class Cluster:
    """n nodes that bootstrap one cluster together."""

    def __init__(self, base: pathlib.Path, n: int, extra: "list[str] | None" = None):
        self.nodes: list[Node] = []
        try:
            for i in range(n):
                nid = f"n{i + 1}"
                args = ["-bootstrap-expect", str(n)] + list(extra or [])
                if "-tls-cert" not in args:
                    args.append("-insecure")
                if i > 0:
                    args += ["-join", self.nodes[0].gossip]
                self.nodes.append(Node(nid, base / nid, args))
        except BaseException:
            self.stop()
            raise

    @property
    def seeds(self) -> "list[str]":
        return [n.grpc for n in self.nodes if n.alive()]

    def stop(self) -> None:
        for n in self.nodes:
            if n.alive():
                n.proc.send_signal(signal.SIGTERM)
        for n in self.nodes:
            n.stop()


def wait_for(cond, timeout: float = 30, what: str = "condition"):
    """Polls cond until it returns a true value (returned), or fails."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # the cluster may still be forming
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f": {last}" if last else ""))
