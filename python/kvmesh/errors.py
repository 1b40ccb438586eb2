"""Exceptions of the kvmesh package. Every failure of a call to a cluster
is a KvmeshError with a message that says what went wrong and where; the
gRPC status, when there is one, is kept in .code and .details."""

from __future__ import annotations


__all__ = ["KvmeshError", "UsageError", "ModelError", "EntryError", "CorruptEntry", "EntryTooLarge", "UnsupportedEntry",
           "InvalidEntry", "NoNodes", "NotFound", "UnknownModel", "PermissionDenied", "InvalidArgument",
           "DeadlineExceeded", "Unavailable", "ResourceExhausted"]


class KvmeshError(Exception):
    """Base of every kvmesh error."""

    code = None  # the grpc.StatusCode, when a node answered with one
    details = ""


class UsageError(KvmeshError, ValueError, TypeError):
    """A call of this package got an argument it does not take (a wrong
    type, length or value, or a call out of order); the message says what
    it expected. It is a ValueError and a TypeError too, so code that
    catches either keeps working."""


def expect(cond: bool, what: str) -> None:
    """Raises UsageError(what) unless cond."""
    if not cond:
        raise UsageError(what)


class ModelError(KvmeshError, ValueError):
    """A config.json or checkpoint that cannot be a model this package runs
    (invalid, or a family or option it does not implement)."""


class EntryError(KvmeshError, ValueError):
    """An encoded entry could not be read or written."""


class CorruptEntry(EntryError):
    """The entry is truncated, inconsistent or fails a checksum."""


class EntryTooLarge(EntryError):
    """The entry exceeds the decoder's Limits."""


class UnsupportedEntry(EntryError):
    """A version or codec this package does not handle."""


class InvalidEntry(EntryError):
    """An entry to encode, or a range to read, is malformed."""


class NoNodes(KvmeshError, ConnectionError):
    """No seed or member of the cluster answered (every node down or
    unreachable)."""


class NotFound(KvmeshError, KeyError):
    """The key is stored on no replica."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0] if self.args else "not found"


class UnknownModel(KvmeshError, ValueError):
    """The cluster does not know the model fingerprint: register it first."""


class PermissionDenied(KvmeshError, PermissionError):
    """The cluster refused the token (missing, unknown, revoked or without
    the role the call needs) or the TLS identity."""


class InvalidArgument(KvmeshError, ValueError):
    """The node rejected the request as malformed."""


class DeadlineExceeded(KvmeshError, TimeoutError):
    """The call's deadline passed before any replica answered."""


class Unavailable(KvmeshError, ConnectionError):
    """The nodes that were tried could not serve the request."""


class ResourceExhausted(KvmeshError):
    """A node refused the request for lack of room or a limit."""
