// Command kvmeshd runs one kvmesh node. See `kvmeshd -h` for its flags; a
// JSON file (-config) may hold the same settings. Once it listens it prints
//
//	kvmeshd listening node=ID grpc=HOST:PORT gossip=HOST:PORT raft=HOST:PORT http=HOST:PORT
//
// and serves until SIGTERM or SIGINT, then shuts down cleanly.
// `kvmeshd version` prints the build's version.
//
// Exit codes (daemon.ExitCode): 0 after a clean shutdown (SIGTERM, or a
// drain that took the node out of the cluster; also -h and version), 1 on
// an error, 2 on a bad command line (unknown flag, stray argument, refused
// value, no -bootstrap/-bootstrap-expect/-join), 3 when the data directory
// belongs to a node that left the cluster (a supervisor should not
// restart it: systemd RestartPreventExitStatus=3).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvmesh/kvmesh/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := daemon.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	code := daemon.ExitCode(err)
	if code == daemon.ExitOK {
		return
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "kvmeshd:") {
		msg = "kvmeshd: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(code)
}
