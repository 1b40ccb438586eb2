// Package respserver is kvmesh's Redis-protocol door: a server of RESP2 and
// RESP3 (as far as Redis clients need) over a Backend that stores opaque
// values. It parses commands, bounds what a client may make it hold, and
// dispatches PING, HELLO, AUTH, GET, SET, SETNX, EXISTS, DEL, MGET, MSET,
// STRLEN, TYPE, INFO and QUIT; every other command is an error reply.
//
// The package knows nothing of the cluster: the node provides the Backend
// (in node.RESPConfig) and the daemon the listener (kvmeshd -resp).
package respserver
