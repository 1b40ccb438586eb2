// Command kvmeshd runs one kvmesh node. See `kvmeshd -h` for its flags; a
// JSON file (-config) may hold the same settings. Once it listens it prints
//
//	kvmeshd ready node=ID grpc=HOST:PORT gossip=HOST:PORT raft=HOST:PORT http=HOST:PORT
//
// and serves until SIGTERM or SIGINT, then shuts down cleanly.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvmesh/kvmesh/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := daemon.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "kvmeshd:", err)
		os.Exit(1)
	}
}
