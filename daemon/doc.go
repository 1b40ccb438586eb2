// Package daemon is kvmeshd's command line: its flags, its JSON
// configuration file (-config), the files they name (gossip keyring,
// token records), and what the process does around a node (the ready
// line, certificate reload on SIGHUP, storing the tokens file's records,
// shutdown when its context ends). It turns all that into a node.Config;
// the server itself is package node.
//
// cmd/kvmeshd is Run behind a signal handler; `kvmesh local-cluster` runs
// it as well when no kvmeshd binary is at hand.
package daemon
