package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/units"
)

// drain runs `kvmesh drain [-keep] NODE`: NODE (an ID or a gRPC address of
// a member) copies its chunks to their other owners and leaves the
// cluster, printing progress as it goes. It is not bounded by -timeout:
// moving a node's data takes as long as it takes; Ctrl-C stops waiting
// (and the node stops draining).
func drain(ctx context.Context, c *client.Client, args []string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keep := fs.Bool("keep", false, "copy the chunks but stay in the cluster")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: kvmesh drain [-keep] NODE")
	}
	addr, id, err := resolveNode(ctx, c, fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "draining %s (%s)\n", id, addr)
	last, err := c.Drain(ctx, addr, *keep, func(p *api.DrainProgress) {
		fmt.Fprintf(w, "%-9s moved %d keys (%s), %d pending\n", p.Phase, p.KeysMoved, units.Bytes(p.BytesMoved), p.Pending)
	})
	if err != nil {
		return fmt.Errorf("drain %s: %w", id, err)
	}
	if last.Left {
		fmt.Fprintf(w, "%s drained (%d keys held, %d copied) and left the cluster; stop its process now\n", id, last.Keys, last.KeysMoved)
	} else {
		fmt.Fprintf(w, "%s drained (%d keys held, %d copied); still a member\n", id, last.Keys, last.KeysMoved)
	}
	return nil
}

// resolveNode maps a member ID or gRPC address to both.
func resolveNode(ctx context.Context, c *client.Client, node string) (addr, id string, err error) {
	info, err := c.ClusterInfo(ctx)
	if err != nil {
		return "", "", err
	}
	var ids []string
	for _, m := range info.Members {
		if m.Id == node || m.GrpcAddr == node {
			return m.GrpcAddr, m.Id, nil
		}
		ids = append(ids, m.Id)
	}
	return "", "", fmt.Errorf("no member %q (members: %s)", node, strings.Join(ids, ", "))
}
