// Command kvmesh-demo is the in-process demo (`make run`): a 3-node
// cluster over loopback gRPC, the trained recall model (train/recall)
// served by the reference engine, memory facts ingested, then queries
// served by prompt injection and by KV injection. It prints TTFT, hit
// kinds and bytes moved, writes a plot, and answers held-out questions of
// the model's evaluation set each way (prompt injection, KV injection of
// EXACT entries, and of APPROXIMATE encodings with recompute) with their
// exact-match accuracy, TTFT and compute, and their fidelity to full
// prefill; a closing summary quotes the tables. -model "" serves random
// weights instead (TTFT only).
//
//	kvmesh-demo [-model DIR] [-facts N] [-k LIST] [-queries N] [-answer-prompts N] [-codec C] [-out DIR] ...
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
