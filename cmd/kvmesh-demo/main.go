// Command kvmesh-demo is the in-process demo (`make run`): a 3-node
// cluster over loopback gRPC, a random-weight model served by the
// reference engine, memory facts ingested, then queries served by prompt
// injection and by KV injection. It prints TTFT, hit kinds, bytes moved
// and fidelity, and writes a plot.
//
//	kvmesh-demo [-facts N] [-k LIST] [-queries N] [-out DIR] ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := demo(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "kvmesh-demo:", err)
		os.Exit(1)
	}
}
