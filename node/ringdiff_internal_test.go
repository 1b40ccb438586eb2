package node

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/ring"
)

func TestRingDiff(t *testing.T) {
	ours := []ring.Member{
		{ID: "n1", GRPCAddr: "a:1", RaftAddr: "a:2", Weight: 32.66},
		{ID: "n2", GRPCAddr: "b:1", RaftAddr: "b:2", Weight: 72.66},
		{ID: "n3", GRPCAddr: "c:1", RaftAddr: "c:2"},
	}
	leader := func(mod func(ms []ring.Member) []ring.Member) []*api.Member {
		ms := mod(append([]ring.Member(nil), ours...))
		out := make([]*api.Member, 0, len(ms))
		for _, m := range ms {
			out = append(out, api.ProtoMember(m))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		mod  func(ms []ring.Member) []ring.Member
		want string
	}{
		{"same", func(ms []ring.Member) []ring.Member { return ms }, ""},
		{"weight", func(ms []ring.Member) []ring.Member { ms[1].Weight = 32.66; return ms },
			"n2 has weight 72.66 here, 32.66 on the leader"},
		{"address", func(ms []ring.Member) []ring.Member { ms[2].RaftAddr = "c:3"; return ms }, "n3 is "},
		{"extra here", func(ms []ring.Member) []ring.Member { return ms[:2] }, "n3 is not in the leader's ring"},
		{"missing here", func(ms []ring.Member) []ring.Member { return append(ms, ring.Member{ID: "n4"}) }, "n4 is missing here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ringDiff(ours, leader(tc.mod))
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("ringDiff = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRingDisagreementNotReady: while the ring differs from the leader's,
// the node is recovering and says why; once it agrees the reason goes.
func TestRingDisagreementNotReady(t *testing.T) {
	n := &Node{log: slog.New(slog.DiscardHandler)}
	err := fmt.Errorf("%w: epoch 5, leader n1: n2 has weight 72.66 here, 32.66 on the leader", errRingDisagrees)
	n.noteRing(err)
	if got := n.recovering(); !errors.Is(got, ErrRecovering) || !strings.Contains(got.Error(), "72.66 here, 32.66 on the leader") {
		t.Fatalf("recovering() = %v, want ErrRecovering with the ring difference", got)
	}
	n.noteRing(errors.New("leader n1: cluster info: unavailable"))
	if got := n.recovering(); got == nil || strings.Contains(got.Error(), "72.66") {
		t.Fatalf("recovering() after another catch-up error = %v, want the catch-up reason", got)
	}
	n.rec.metaCaughtUp.Store(true)
	n.rec.pullDone.Store(true) // every start waits for its startup pull too
	n.noteRing(nil)
	if got := n.recovering(); got != nil {
		t.Fatalf("recovering() once caught up = %v", got)
	}
}
