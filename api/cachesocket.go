package api

import "errors"

// The cache socket is how an engine hands its local node the shared
// memory of its paged KV cache: a file descriptor passed over a unix
// stream socket (SCM_RIGHTS), never a path. The node maps only what its
// caller already holds open read-write, so a caller cannot point it at a
// file of the node's or of another process.
//
// One connection carries one hand-over. The engine sends the 8 bytes
// CacheSocketHello with exactly one descriptor attached; the node answers
// one status byte, then (status 0) CacheHandleBytes of handle, which the
// engine puts in RegisterCacheRequest.memory_handle. Status 1 is a
// refusal; no reason is given, so the answer describes nothing about the
// file. Injector.CacheSocket names the socket.

// CacheSocketHello opens a hand-over on the cache socket.
const CacheSocketHello = "KVMFD\x00\x00\x01"

// CacheHandleBytes is the length of a memory handle.
const CacheHandleBytes = 32

// Status bytes of a cache socket answer.
const (
	cacheFileTaken   = 0
	cacheFileRefused = 1
)

// ErrCacheRefused is a cache socket's refusal of a file (or of a
// registration naming a handle it does not know).
var ErrCacheRefused = errors.New("api: shared memory refused")
