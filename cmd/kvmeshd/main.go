// Command kvmeshd runs one kvmesh node. See `kvmeshd -h` for its flags; a
// JSON file (-config) may hold the same settings. Once it listens it prints
//
//	kvmeshd listening node=ID grpc=HOST:PORT gossip=HOST:PORT raft=HOST:PORT http=HOST:PORT
//
// and serves until SIGTERM or SIGINT, then shuts down cleanly.
// `kvmeshd version` prints the build's version.
//
// Exit codes: 0 after a clean shutdown (and after -h), 1 on an error,
// 2 on a bad command line (unknown flag, stray argument, refused value).
package main

import (
	"context"
	"errors"
	"flag"
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
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "kvmeshd:") {
		msg = "kvmeshd: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	if errors.Is(err, daemon.ErrUsage) {
		os.Exit(2)
	}
	os.Exit(1)
}
