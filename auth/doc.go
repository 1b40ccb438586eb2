// Package auth decides who may call a kvmesh node, what they may do, and
// how much at once.
//
// Clients present API tokens ("authorization: Bearer <id>.<secret>");
// the cluster stores only a salted HMAC-SHA256 of each secret (a Record,
// kept in the Raft metadata behind the TokenTable interface) and compares
// in constant time. A token carries scopes (read, write, admin) and an
// optional namespace: the model fingerprint prefixes it may touch. Nodes
// are identified by their mutual-TLS node certificate (see tlsconf) and
// alone may call the peer API.
//
// A Guard's gRPC interceptors authenticate every call, map its full method
// name to the scope it needs (table driven; a method not in the table is
// denied), and put the caller's Principal in the context, where handlers
// check each model fingerprint with CheckFingerprint once they have parsed
// the request. A StreamLimiter bounds the concurrent streams of each
// caller. Failures are gRPC statuses: Unauthenticated, PermissionDenied,
// ResourceExhausted.
package auth
