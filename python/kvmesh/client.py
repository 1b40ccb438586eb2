"""The Python client of a kvmesh cluster, the counterpart of Go's client
package: it dials any seed, learns the ring with ClusterInfo, and sends each
request to a replica of the chunk's content ID (the same placement as every
node, kvmesh.placement), failing over to the next replica on Unavailable and
retrying with backoff within the call's deadline. Lookups are batched per
replica set. A node that answers with a newer ring epoch makes the client
refresh its ring.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable, Iterable, Sequence

import grpc
import numpy as np

from . import entry as entrylib
from ._pb import admin_pb2, admin_pb2_grpc, kvmesh_pb2, kvmesh_pb2_grpc
from .errors import (DeadlineExceeded, InvalidArgument, KvmeshError, NoNodes, NotFound, PermissionDenied,
                     ResourceExhausted, Unavailable, UnknownModel, UsageError)
from .keys import (ID, Context, ContextKind, DType, Fingerprint, Key, ModelSpec, RopeScaling, RopeStyle, _fp, _is_int,
                   want_context, want_id)
from .placement import Member, Ring

__all__ = ["Client", "TLSConfig", "Match", "LookupItem", "LookupResult", "PutResult", "RangeResult", "ClusterInfo",
           "Settings", "translate"]

EPOCH_HEADER = "kvmesh-epoch"
DEFAULT_FRAME_BYTES = 1 << 20  # api.DefaultFrameBytes
MAX_LOOKUP_BATCH = 4096  # node.MaxLookupBatch
_MAX_RECV = 8 << 20


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """Files of a cluster running mutual TLS: the cluster CA and a client
    certificate and key (`kvmesh certs -client`). server_name overrides the
    name checked in node certificates."""

    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""


class Match:
    """How a lookup answer relates to the wanted context."""

    MISS = "MISS"
    EXACT = "EXACT"
    APPROXIMATE = "APPROXIMATE"


_MATCH_OF = {kvmesh_pb2.LOOKUP_STATUS_MISS: Match.MISS, kvmesh_pb2.LOOKUP_STATUS_EXACT: Match.EXACT,
             kvmesh_pb2.LOOKUP_STATUS_APPROXIMATE: Match.APPROXIMATE}


@dataclasses.dataclass(frozen=True)
class LookupItem:
    """Asks for the best encoding of content for use after want: the
    context that makes an entry EXACT (the chunk's prefix-chain context,
    usually); otherwise the node answers its best other encoding as
    APPROXIMATE (chunk.Better: another prefix, then the widest window,
    then standalone)."""

    content: ID
    want: Context

    def __post_init__(self):
        want_id(self.content, "LookupItem.content")
        want_context(self.want, "LookupItem.want")


@dataclasses.dataclass(frozen=True)
class LookupResult:
    match: str
    key: "Key | None"
    blob_bytes: int
    holders: "list[Member]"


@dataclasses.dataclass(frozen=True)
class PutResult:
    """Where a put landed and which version of the key the cluster keeps.

    checksum is that of the entry this put stored (in the cluster codec).
    already_stored: the key was already held with other bytes, and the
    cluster keeps those (the smaller checksum wins); this put's bytes were
    dropped. Not an error: two honest producers of a chunk may encode
    slightly different bytes. kept_checksum is the kept version's checksum
    (checksum unless already_stored)."""

    checksum: int
    stored_on: "list[str]"
    already_stored: bool = False
    kept_checksum: int = 0


@dataclasses.dataclass(frozen=True)
class RangeResult:
    """Decoded K/V of a layer and head range: kv has shape
    [layers, 2, tokens, heads, head_dim] over the range (bf16 as uint16)."""

    shape: entrylib.Shape
    range: entrylib.Range
    tokens: np.ndarray
    kv: np.ndarray


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    node_id: str
    epoch: int
    members: "list[Member]"
    leader_id: str
    leader_grpc_addr: str
    replication_factor: int
    write_quorum: int
    codec: str


@dataclasses.dataclass(frozen=True)
class Settings:
    """Cluster settings as the answering node applied them."""

    replication_factor: int
    write_quorum: int
    codec: str
    version: int
    node_id: str


# Conversions between the wire messages and the package's types (as Go's
# api/convert.go).

def _want_key(key, what: str) -> Key:
    if not isinstance(key, Key):
        raise UsageError(f"{what}: want a kvmesh.Key, got {type(key).__name__}")
    return key


def _pid(i: ID) -> kvmesh_pb2.ID:
    return kvmesh_pb2.ID(lo=i.lo, hi=i.hi)


def _id(p) -> ID:
    return ID(p.lo, p.hi)


def _pcontext(c: Context) -> kvmesh_pb2.Context:
    return kvmesh_pb2.Context(kind=int(c.kind), window=c.window, id=_pid(c.id))


def _pkey(k: Key) -> kvmesh_pb2.Key:
    return kvmesh_pb2.Key(fingerprint=_pid(k.fingerprint), content=_pid(k.content), context=_pcontext(k.context))


def _key(p) -> Key:
    if p.context.kind not in (1, 2, 3):
        raise KvmeshError(f"node answered a key with context kind {p.context.kind}")
    return Key(_id(p.fingerprint), _id(p.content), Context(ContextKind(p.context.kind), p.context.window, _id(p.context.id)))


def _member(p) -> Member:
    return Member(id=p.id, grpc_addr=p.grpc_addr, raft_addr=p.raft_addr, gossip_addr=p.gossip_addr,
                  http_addr=p.http_addr, weight=p.weight)


def _pspec(s: ModelSpec) -> kvmesh_pb2.ModelSpec:
    sc = s.scaling
    return kvmesh_pb2.ModelSpec(
        family=s.family, layers=s.layers, kv_heads=s.kv_heads, head_dim=s.head_dim, dtype=int(s.dtype),
        rope_style=int(s.rope_style), rope_theta=s.rope_theta, rotary_dim=s.rotary_dim,
        scaling=kvmesh_pb2.RopeScaling(
            type=sc.type, factor=sc.factor, low_freq_factor=sc.low_freq_factor, high_freq_factor=sc.high_freq_factor,
            original_max_positions=sc.original_max_positions, beta_fast=sc.beta_fast, beta_slow=sc.beta_slow,
            attention_factor=sc.attention_factor, max_positions=sc.max_positions),
        weights_revision=s.weights_revision, tokenizer_id=s.tokenizer_id, salt=s.salt)


def _spec(p) -> ModelSpec:
    sc = p.scaling
    return ModelSpec(
        family=p.family, layers=p.layers, kv_heads=p.kv_heads, head_dim=p.head_dim, dtype=DType(p.dtype),
        rope_style=RopeStyle(p.rope_style), rope_theta=p.rope_theta, rotary_dim=p.rotary_dim,
        scaling=RopeScaling(type=sc.type, factor=sc.factor, low_freq_factor=sc.low_freq_factor,
                            high_freq_factor=sc.high_freq_factor, original_max_positions=sc.original_max_positions,
                            beta_fast=sc.beta_fast, beta_slow=sc.beta_slow, attention_factor=sc.attention_factor,
                            max_positions=sc.max_positions),
        weights_revision=p.weights_revision, tokenizer_id=p.tokenizer_id, salt=p.salt)


_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED)


class _Retry(Exception):
    """A replica answered badly (short or corrupt data): try another."""


def translate(err: grpc.RpcError, what: str, addr: str = "") -> KvmeshError:
    """Turns a gRPC failure into the package's exception for its status
    code, with a message that names the call and the node."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else "") or ""
    where = f" (node {addr})" if addr else ""
    if code == grpc.StatusCode.FAILED_PRECONDITION and "unknown model" in details:
        cls, msg = UnknownModel, details
    elif code == grpc.StatusCode.NOT_FOUND:
        cls, msg = NotFound, f"{what}: not found"
    elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        cls, msg = PermissionDenied, f"{what}: refused: {details}"
    elif code == grpc.StatusCode.INVALID_ARGUMENT:
        cls, msg = InvalidArgument, f"{what}: invalid request: {details}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        cls, msg = DeadlineExceeded, f"{what}: deadline exceeded{where}"
    elif code == grpc.StatusCode.UNAVAILABLE:
        cls, msg = Unavailable, f"{what}: node unavailable{where}: {details}"
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        cls, msg = ResourceExhausted, f"{what}: {details}"
    else:
        cls, msg = KvmeshError, f"{what}: {code.name if code else 'error'}: {details}"
    e = cls(msg)
    e.code, e.details = code, details
    return e


class Client:
    """A client of one cluster; safe to use from several threads. Close it
    (or use it as a context manager) when done.

    seeds: gRPC addresses (host:port) of any members. rpc_timeout bounds
    one attempt on one node; a call's `timeout` (default `deadline`) bounds
    all its attempts together. attempts rounds over the replicas are tried,
    with a ring refresh and a backoff (doubling from backoff up to
    max_backoff) between rounds. token ("<id>.<secret>") is sent as
    "authorization: Bearer" on every call, over TLS only unless
    allow_token_without_tls.
    """

    def __init__(self, seeds: "Sequence[str] | str", *, tls: "TLSConfig | None" = None, token: str = "",
                 allow_token_without_tls: bool = False, rpc_timeout: float = 10.0, deadline: float = 30.0,
                 attempts: int = 4, backoff: float = 0.05, max_backoff: float = 1.0,
                 frame_bytes: int = DEFAULT_FRAME_BYTES, limits: entrylib.Limits = entrylib.DEFAULT_LIMITS):
        if isinstance(seeds, str):
            seeds = [s for s in seeds.split(",") if s]
        if not isinstance(seeds, (list, tuple)) or not all(isinstance(s, str) and s for s in seeds):
            raise UsageError(f"kvmesh.Client: seeds: want host:port strings (a list, or one comma-separated string), "
                             f"got {seeds!r}")
        if not seeds:
            raise UsageError("kvmesh.Client: no seeds")
        if tls is not None and not isinstance(tls, TLSConfig):
            raise UsageError(f"kvmesh.Client: tls: want a kvmesh.TLSConfig, got {type(tls).__name__}")
        if not isinstance(token, str):
            raise UsageError(f"kvmesh.Client: token: want a string, got {type(token).__name__}")
        if token and "." not in token:
            raise UsageError("kvmesh.Client: a token looks like <id>.<secret>")
        if token and tls is None and not allow_token_without_tls:
            raise UsageError("kvmesh.Client: refusing to send a token without TLS (pass tls=, or "
                             "allow_token_without_tls=True for a loopback test cluster)")
        self.seeds = list(seeds)
        self.rpc_timeout, self.deadline = rpc_timeout, deadline
        self.attempts, self.backoff, self.max_backoff = max(attempts, 1), backoff, max_backoff
        self.frame_bytes, self.limits = frame_bytes, limits
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._creds = None
        self._options = [("grpc.max_receive_message_length", _MAX_RECV)]
        if tls is not None:
            def read(p):
                if not p:
                    return None
                with open(p, "rb") as f:
                    return f.read()
            self._creds = grpc.ssl_channel_credentials(read(tls.ca_file), read(tls.key_file), read(tls.cert_file))
            if tls.server_name:
                self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._lock = threading.Lock()
        self._channels: dict = {}
        self._closed = False
        self._refreshing = False
        self._ring = Ring(0, [])
        self._info = ClusterInfo("", 0, [], "", "", 1, 1, "")
        try:
            self.refresh()
        except BaseException:
            self.close()
            raise

    # -- connections and the ring ------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Closes every connection; the client is unusable afterwards."""
        with self._lock:
            self._closed = True
            chans, self._channels = self._channels, {}
        for ch in chans.values():
            ch.close()

    def _channel(self, addr: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise KvmeshError("kvmesh.Client is closed")
            ch = self._channels.get(addr)
            if ch is None:
                if self._creds is not None:
                    ch = grpc.secure_channel(addr, self._creds, options=self._options)
                else:
                    ch = grpc.insecure_channel(addr, options=self._options)
                self._channels[addr] = ch
            return ch

    def _stub(self, addr: str, kind=kvmesh_pb2_grpc.ClientStub):
        return kind(self._channel(addr))

    @property
    def ring(self) -> Ring:
        return self._ring

    @property
    def replication_factor(self) -> int:
        return max(self._info.replication_factor, 1)

    def _candidates(self) -> "list[str]":
        out: list[str] = []
        for m in self._ring.members:
            if m.grpc_addr and m.grpc_addr not in out:
                out.append(m.grpc_addr)
        for s in self.seeds:
            if s not in out:
                out.append(s)
        return out

    def refresh(self, timeout: "float | None" = None) -> ClusterInfo:
        """Fetches ClusterInfo from a member (or a seed) and adopts its ring
        unless it is older than the client's."""
        end = time.monotonic() + (timeout or self.deadline)
        last: "Exception | None" = None
        for addr in self._candidates():
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                resp = self._stub(addr).ClusterInfo(kvmesh_pb2.ClusterInfoRequest(), metadata=self._metadata,
                                                   timeout=min(self.rpc_timeout, left))
            except grpc.RpcError as e:
                last = translate(e, "ClusterInfo", addr)
                if isinstance(last, PermissionDenied):
                    raise last from None
                continue
            return self._adopt(resp)
        err = NoNodes(f"no cluster node answered (tried {', '.join(self._candidates())})"
                      + (f": {last}" if last else ""))
        raise err from None

    def _adopt(self, resp) -> ClusterInfo:
        info = ClusterInfo(resp.node_id, resp.epoch, [_member(m) for m in resp.members], resp.leader_id,
                           resp.leader_grpc_addr, resp.replication_factor, resp.write_quorum, resp.codec)
        with self._lock:
            old = self._info
            if old.epoch > info.epoch or (old.epoch == info.epoch and old.members and not info.members):
                return info
            self._info, self._ring = info, Ring(info.epoch, info.members)
        return info

    def _note_epoch(self, md) -> None:
        """Refreshes the ring in the background when a node answered with a
        newer epoch than the client's (one refresh at a time)."""
        for k, v in md or ():
            if k != EPOCH_HEADER:
                continue
            try:
                e = int(v)
            except ValueError:
                return
            with self._lock:
                if e <= self._info.epoch or self._refreshing or self._closed:
                    return
                self._refreshing = True

            def run():
                try:
                    self.refresh(timeout=self.rpc_timeout)
                except KvmeshError:
                    pass  # the next call's failover refreshes again
                finally:
                    with self._lock:
                        self._refreshing = False

            threading.Thread(target=run, name="kvmesh-refresh", daemon=True).start()
            return

    def _targets(self, content: "ID | None") -> "list[str]":
        r = self._ring
        if content is not None and len(r) > 0:
            return [m.grpc_addr for m in r.replicas(content, self.replication_factor) if m.grpc_addr]
        return self._candidates()

    def _do(self, what: str, content: "ID | None", call: Callable, timeout: "float | None"):
        """Runs call(addr, attempt_timeout) on the targets of content until
        one succeeds, failing over on retryable errors and refreshing the
        ring between rounds, all within timeout."""
        end = time.monotonic() + (timeout if timeout is not None else self.deadline)
        backoff = self.backoff
        last: "KvmeshError | None" = None
        tried: list[str] = []
        for rnd in range(self.attempts):
            for addr in self._targets(content):
                left = end - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(f"{what}: deadline exceeded after trying {', '.join(tried) or 'no node'}"
                                           + (f"; last error: {last}" if last else ""))
                tried.append(addr)
                try:
                    return call(addr, min(self.rpc_timeout, left))
                except grpc.RpcError as e:
                    last = translate(e, what, addr)
                    if e.code() not in _RETRYABLE:
                        raise last from None
                except _Retry as e:
                    last = Unavailable(f"{what}: node {addr}: {e}")
            if rnd + 1 == self.attempts:
                break
            try:
                self.refresh(timeout=max(min(self.rpc_timeout, end - time.monotonic()), 0.001))
            except KvmeshError:
                pass
            pause = min(backoff, end - time.monotonic())
            if pause > 0:
                time.sleep(pause)
            backoff = min(2 * backoff, self.max_backoff)
        nodes = ", ".join(dict.fromkeys(tried)) or "none"
        if isinstance(last, DeadlineExceeded) or last is None:
            raise (last or NoNodes(f"{what}: no cluster node to ask")) from None
        e = Unavailable(f"{what}: every replica failed (nodes down? tried {nodes}): {last}")
        e.code, e.details = last.code, last.details
        raise e from None

    # -- cluster and models ------------------------------------------------

    def cluster_info(self, timeout: "float | None" = None) -> ClusterInfo:
        """Asks a node for the members, leader and settings, and adopts its
        ring."""
        resp = self._do("ClusterInfo", None, lambda a, t: self._stub(a).ClusterInfo(
            kvmesh_pb2.ClusterInfoRequest(), metadata=self._metadata, timeout=t), timeout)
        return self._adopt(resp)

    def settings(self, timeout: "float | None" = None) -> Settings:
        """The cluster settings (Admin.GetSettings; needs the admin scope
        when the cluster checks tokens)."""
        resp = self._do("GetSettings", None, lambda a, t: self._stub(a, admin_pb2_grpc.AdminStub).GetSettings(
            admin_pb2.GetSettingsRequest(), metadata=self._metadata, timeout=t), timeout)
        s = resp.settings
        return Settings(s.replication_factor, s.write_quorum, s.codec, resp.version, resp.node_id)

    def register_model(self, spec: ModelSpec, timeout: "float | None" = None) -> Fingerprint:
        """Registers spec cluster-wide and returns its fingerprint."""
        if not isinstance(spec, ModelSpec):
            raise UsageError(f"register_model: want a kvmesh.ModelSpec, got {type(spec).__name__}")
        spec.validate()
        resp = self._do("RegisterModel", None, lambda a, t: self._stub(a).RegisterModel(
            kvmesh_pb2.RegisterModelRequest(spec=_pspec(spec)), metadata=self._metadata, timeout=t), timeout)
        fp = _id(resp.fingerprint)
        if fp != spec.fingerprint():
            raise KvmeshError(f"RegisterModel: cluster fingerprint {fp} differs from the local {spec.fingerprint()}")
        return fp

    def models(self, timeout: "float | None" = None) -> "list[ModelSpec]":
        """The model specs registered with the cluster."""
        resp = self._do("Models", None, lambda a, t: self._stub(a).Models(
            kvmesh_pb2.ModelsRequest(), metadata=self._metadata, timeout=t), timeout)
        return [_spec(m.spec) for m in resp.models]

    # -- entries -----------------------------------------------------------

    def put(self, blob: "bytes | entrylib.Entry", codec: "entrylib.Codec | str" = entrylib.Codec.RAW,
            timeout: "float | None" = None) -> PutResult:
        """Stores an encoded entry (or an Entry, encoded with codec) on its
        replica set."""
        if isinstance(blob, entrylib.Entry):
            blob = entrylib.encode(blob, codec)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise UsageError(f"put: want an Entry or its encoded bytes, got {type(blob).__name__}")
        blob = bytes(blob)
        hd = entrylib.parse_header(blob, self.limits)
        header = kvmesh_pb2.PutFrame(header=kvmesh_pb2.PutHeader(key=_pkey(hd.key), blob_bytes=len(blob)))
        fb = self.frame_bytes

        def frames():
            yield header
            mv = memoryview(blob)
            for i in range(0, len(blob), fb):
                yield kvmesh_pb2.PutFrame(data=bytes(mv[i:i + fb]))

        def call(addr, t):
            resp, c = self._stub(addr).Put.with_call(frames(), metadata=self._metadata, timeout=t)
            self._note_epoch(c.initial_metadata())
            # A node that does not say (kept_checksum 0) kept this entry.
            return PutResult(resp.checksum, list(resp.stored_on), resp.already_stored,
                             resp.kept_checksum or resp.checksum)

        return self._do("Put", hd.key.content, call, timeout)

    def _get(self, addr: str, t: float, req):
        stream = self._stub(addr).Get(req, metadata=self._metadata, timeout=t)
        hdr, parts, n = None, [], 0
        for fr in stream:
            if hdr is None:
                if fr.WhichOneof("kind") != "header":
                    raise _Retry("stream did not start with a header")
                hdr = fr.header
                if hdr.total_bytes > self.limits.max_blob_bytes:
                    raise KvmeshError(f"Get: answer of {hdr.total_bytes} bytes exceeds limits")
                continue
            parts.append(fr.data)
            n += len(fr.data)
            if n > hdr.total_bytes:
                raise _Retry("more data than the header announced")
        self._note_epoch(stream.initial_metadata())
        if hdr is None or n != hdr.total_bytes:
            raise _Retry("short answer")
        return hdr, b"".join(parts)

    def get(self, key: Key, timeout: "float | None" = None) -> bytes:
        """The whole encoded entry of key, every checksum verified (a
        replica that sends corrupt bytes is skipped). NotFound if no
        replica holds it."""
        _want_key(key, "get")

        def call(addr, t):
            _, data = self._get(addr, t, kvmesh_pb2.GetRequest(key=_pkey(key), format=kvmesh_pb2.FORMAT_ENTRY))
            try:
                hd = entrylib.verify(data, self.limits)
            except entrylib.EntryError as e:
                raise _Retry(f"bad entry: {e}") from None
            if hd.key != key:
                raise _Retry(f"entry of another key {hd.key}")
            return data

        return self._do(f"Get {key}", key.content, call, timeout)

    def get_entry(self, key: Key, timeout: "float | None" = None) -> entrylib.Entry:
        """Get, decoded here (get_range has the node decode)."""
        _want_key(key, "get_entry")
        return entrylib.decode(self.get(key, timeout), self.limits)

    def get_range(self, key: Key, r: entrylib.Range = entrylib.Range(), timeout: "float | None" = None) -> RangeResult:
        """The decoded K/V of a layer and head range of key, decoded by the
        node (any codec)."""
        _want_key(key, "get_range")
        if not isinstance(r, entrylib.Range):
            raise UsageError(f"get_range: want a kvmesh.Range, got {type(r).__name__}")
        req = kvmesh_pb2.GetRequest(key=_pkey(key), format=kvmesh_pb2.FORMAT_RAW, layer_lo=r.layer_lo,
                                    layer_hi=r.layer_hi, head_lo=r.head_lo, head_hi=r.head_hi)

        def call(addr, t):
            hdr, data = self._get(addr, t, req)
            sh = hdr.shape
            shape = entrylib.Shape(DType(sh.dtype), sh.tokens, sh.layers, sh.kv_heads, sh.head_dim)
            rr = entrylib.Range(hdr.layer_lo, hdr.layer_hi, hdr.head_lo, hdr.head_hi)
            dims = (rr.layer_hi - rr.layer_lo, 2, shape.tokens, rr.head_hi - rr.head_lo, shape.head_dim)
            nd = entrylib._np_dtype(shape.dtype)
            if len(data) != int(np.prod(dims)) * nd.itemsize:
                raise _Retry("range of the wrong size")
            kv = np.frombuffer(data, dtype=nd).reshape(dims)
            return RangeResult(shape, rr, np.asarray(hdr.tokens, dtype=np.uint32), kv)

        return self._do(f"Get {key}", key.content, call, timeout)

    def delete(self, key: Key, timeout: "float | None" = None) -> int:
        """Removes key from its replicas; returns how many held it."""
        _want_key(key, "delete")
        resp = self._do(f"Delete {key}", key.content, lambda a, t: self._stub(a).Delete(
            kvmesh_pb2.DeleteRequest(key=_pkey(key)), metadata=self._metadata, timeout=t), timeout)
        return resp.deleted

    def lookup(self, fp: Fingerprint, items: "Iterable[LookupItem]", timeout: "float | None" = None) -> "list[LookupResult]":
        """Answers items, in order, with one call per replica set (batches
        of at most 4096 items)."""
        _fp(fp, "lookup")
        if isinstance(items, LookupItem):
            raise UsageError("lookup: want a list of LookupItems, got one (wrap it in a list)")
        items = list(items)
        for i, it in enumerate(items):
            if not isinstance(it, LookupItem):
                raise UsageError(f"lookup: item {i}: want a kvmesh.LookupItem(content, want), got {type(it).__name__}")
        groups: dict = {}
        r = self._ring
        for i, it in enumerate(items):
            o = r.owner(it.content) if len(r) else None
            groups.setdefault(o.id if o else "", []).append(i)
        out: list = [None] * len(items)
        batches = [idx[s:s + MAX_LOOKUP_BATCH] for idx in groups.values() for s in range(0, len(idx), MAX_LOOKUP_BATCH)]
        if len(batches) == 1:
            self._lookup_batch(fp, items, batches[0], out, timeout)
            return out
        # One call per replica set, all at once.
        with concurrent.futures.ThreadPoolExecutor(min(len(batches), 16)) as ex:
            for f in [ex.submit(self._lookup_batch, fp, items, b, out, timeout) for b in batches]:
                f.result()
        return out

    def _lookup_batch(self, fp, items, idx, out, timeout):
        req = kvmesh_pb2.LookupRequest(fingerprint=_pid(fp), items=[
            kvmesh_pb2.LookupItem(content=_pid(items[i].content), want=_pcontext(items[i].want)) for i in idx])

        def call(addr, t):
            resp, c = self._stub(addr).Lookup.with_call(req, metadata=self._metadata, timeout=t)
            self._note_epoch(c.initial_metadata())
            return resp

        resp = self._do("Lookup", items[idx[0]].content, call, timeout)
        if len(resp.results) != len(idx):
            raise KvmeshError(f"Lookup answered {len(resp.results)} of {len(idx)} items")
        for j, i in enumerate(idx):
            res = resp.results[j]
            m = _MATCH_OF.get(res.status, Match.MISS)
            out[i] = LookupResult(m, _key(res.key) if m != Match.MISS else None, res.blob_bytes,
                                  [_member(h) for h in res.holders])

    def stats(self, addr: "str | None" = None, timeout: "float | None" = None):
        """Store statistics of the node at addr (default: any node), as the
        StatsResponse message."""
        if addr is None:
            return self._do("Stats", None, lambda a, t: self._stub(a).Stats(
                kvmesh_pb2.StatsRequest(), metadata=self._metadata, timeout=t), timeout)
        try:
            return self._stub(addr).Stats(kvmesh_pb2.StatsRequest(), metadata=self._metadata,
                                          timeout=timeout or self.rpc_timeout)
        except grpc.RpcError as e:
            raise translate(e, "Stats", addr) from None

    # -- injection ---------------------------------------------------------

    def register_cache(self, addr: str, fingerprint: Fingerprint, cache, head_lo: int = 0, head_hi: int = 0,
                       max_positions: int = 0):
        """Registers a kvmesh.inject.PagedCache with the node at addr (the
        node on this machine) and returns the Injector that fills it.
        head_lo/head_hi: the model KV heads the cache holds (both 0: all).
        max_positions bounds the target positions chunks may be injected
        at (the size of the node's RoPE table for this cache; 0: the
        node's default, 32768): an InjectChunk whose pos + len(tokens)
        exceeds it is refused. The cache's memfd goes to the node as a
        file descriptor on the node's cache socket (never as a path); a
        cache registered already is refused (PermissionDenied) until it is
        unregistered. A CUDAPagedCache (PagedCache.cuda) registers by CUDA
        IPC or through its pinned host staging, as its staging says (a
        StagedInjector then copies what the node writes to the tensors)."""
        from .inject import register_cache
        return register_cache(self, addr, fingerprint, cache, head_lo, head_hi, max_positions)
