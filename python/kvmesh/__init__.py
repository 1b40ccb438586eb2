"""kvmesh: the Python client of a kvmesh KV-cache cluster.

- keys: model fingerprints, content IDs and contexts (docs/KEYS.md);
- entry: encoded chunk entries: encode raw and lossless, decode every codec
  (docs/KEYS.md section 6);
- placement: which nodes hold a chunk (docs/PLACEMENT.md);
- client: the cluster client (Put, Get, Lookup, Delete, models, settings);
- inject: a paged KV cache in shared memory that a local node fills;
- torch (optional, needs PyTorch): capture of pre-RoPE K and V.

Everything here is byte-identical to the Go implementation; the shared
vectors under chunk/testdata/vectors and ring/testdata check that. Every
failure is a KvmeshError: UsageError for an argument the package does not
take, the others for what a node or an entry answered (docs/PYTHON.md).
"""

from .client import (Client, ClusterInfo, LookupItem, LookupResult, Match, PutResult, RangeResult, Settings,
                     TLSConfig)
from .entry import Codec, Entry, Header, Limits, Range, Shape, decode, decode_range, encode, parse_header, verify
from .errors import (CorruptEntry, DeadlineExceeded, EntryError, EntryTooLarge, InvalidArgument, InvalidEntry,
                     KvmeshError, ModelError, NoNodes, NotFound, PermissionDenied, ResourceExhausted, Unavailable, UnknownModel,
                     UnsupportedEntry, UsageError)
from .keys import (ID, Context, ContextKind, DType, Fingerprint, Key, ModelSpec, RopeScaling, RopeStyle, canonical,
                   check_key, content_id, next_prefix, prefix_chain, prefix_context, prefix_root, standalone_context,
                   window_context, window_id, window_or_prefix)
from .placement import Member, Ring

__all__ = [
    # client
    "Client", "ClusterInfo", "LookupItem", "LookupResult", "Match", "PutResult", "RangeResult", "Settings",
    "TLSConfig",
    # entries
    "Codec", "Entry", "Header", "Limits", "Range", "Shape", "decode", "decode_range", "encode", "parse_header",
    "verify",
    # errors
    "KvmeshError", "UsageError", "CorruptEntry", "DeadlineExceeded", "EntryError", "EntryTooLarge",
    "InvalidArgument", "InvalidEntry", "ModelError", "NoNodes", "NotFound", "PermissionDenied", "ResourceExhausted",
    "Unavailable", "UnknownModel", "UnsupportedEntry",
    # keys
    "ID", "Context", "ContextKind", "DType", "Fingerprint", "Key", "ModelSpec", "RopeScaling", "RopeStyle",
    "canonical", "check_key", "content_id", "next_prefix", "prefix_chain", "prefix_context", "prefix_root",
    "standalone_context", "window_context", "window_id", "window_or_prefix",
    # placement
    "Member", "Ring",
]
