package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/internal/units"
)

// statusOut is `kvmesh status -format json`.
type statusOut struct {
	Epoch             uint64       `json:"epoch"`
	Leader            string       `json:"leader"`
	LeaderGRPC        string       `json:"leader_grpc"`
	ReplicationFactor uint32       `json:"replication_factor"`
	WriteQuorum       uint32       `json:"write_quorum"`
	Codec             string       `json:"codec"`
	Nodes             []nodeStatus `json:"nodes"`
}

type nodeStatus struct {
	ID   string `json:"id"`
	GRPC string `json:"grpc"`
	HTTP string `json:"http"`
	Up   bool   `json:"up"`
	// State is what the node reports (api.StateReady, StateRecovering,
	// StateJoining, StateLeft), or "unreachable" when it does not answer;
	// StateReason says why it is not ready.
	State       string       `json:"state"`
	StateReason string       `json:"state_reason,omitempty"`
	Error       string       `json:"error,omitempty"`
	Entries     uint64       `json:"entries"`
	Bytes       uint64       `json:"bytes"`
	Tiers       []tierStatus `json:"tiers"`
}

type tierStatus struct {
	Name          string `json:"name"`
	Entries       uint64 `json:"entries"`
	Bytes         uint64 `json:"bytes"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	Evictions     uint64 `json:"evictions"`
}

// stateUnreachable is the state of a member that does not answer.
const stateUnreachable = "unreachable"

// errNoLeader: the cluster has no leader, so no quorum for writes.
var errNoLeader = errors.New("no leader: the cluster has no quorum (fewer than a majority of its Raft voters are up); metadata writes fail until enough nodes are back")

func statusCmd(ctx context.Context, e *env, args []string) error {
	_, c, err := e.connected(ctx, e.flags("status"), args, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	info, err := c.ClusterInfo(c.ctx)
	if err != nil {
		return plain("status", err)
	}
	out := statusOut{Epoch: info.Epoch, Leader: info.LeaderId, LeaderGRPC: info.LeaderGrpcAddr,
		ReplicationFactor: info.ReplicationFactor, WriteQuorum: info.WriteQuorum, Codec: info.Codec, Nodes: []nodeStatus{}}
	down := 0
	for _, m := range info.Members {
		ns := nodeStatus{ID: m.Id, GRPC: m.GrpcAddr, HTTP: m.HttpAddr, Tiers: []tierStatus{}}
		st, state, err := c.StatsAndState(c.ctx, m.GrpcAddr)
		if err != nil {
			ns.State, ns.Error = stateUnreachable, describe(err)
			down++
		} else {
			ns.State, ns.StateReason = api.SplitState(state)
			ns.Up, ns.Entries, ns.Bytes = true, st.Entries, st.Bytes
			for _, t := range st.Tiers {
				ns.Tiers = append(ns.Tiers, tierStatus{t.Name, t.Entries, t.Bytes, t.CapacityBytes, t.Evictions})
			}
		}
		out.Nodes = append(out.Nodes, ns)
	}
	if err := e.print(out, func(w io.Writer) error { return printStatus(w, out) }); err != nil {
		return err
	}
	switch {
	case out.Leader == "":
		return errNoLeader
	case down > 0:
		return fmt.Errorf("%d of %d members do not answer", down, len(out.Nodes))
	}
	return nil
}

func printStatus(w io.Writer, s statusOut) error {
	leader := s.Leader + " (" + s.LeaderGRPC + ")"
	if s.Leader == "" {
		leader = "NONE (no quorum)"
	}
	fmt.Fprintf(w, "epoch %d  leader %s  replication %d  write quorum %d  codec %s\n\n",
		s.Epoch, leader, s.ReplicationFactor, s.WriteQuorum, s.Codec)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGRPC\tHTTP\tENTRIES\tBYTES\tTIERS")
	for _, n := range s.Nodes {
		if !n.Up {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\tdown: %s\n", n.ID, n.State, n.GRPC, n.HTTP, n.Error)
			continue
		}
		var tiers []string
		for _, t := range n.Tiers {
			tiers = append(tiers, fmt.Sprintf("%s %d entries %s/%s evicted %d", t.Name, t.Entries, units.Bytes(t.Bytes), units.Bytes(t.CapacityBytes), t.Evictions))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, n.State, n.GRPC, n.HTTP, n.Entries, units.Bytes(n.Bytes), strings.Join(tiers, "; "))
	}
	return tw.Flush()
}
