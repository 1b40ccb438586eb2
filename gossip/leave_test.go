package gossip

import (
	"net"
	"testing"

	"github.com/hashicorp/memberlist"
)

// TestGossipLeaveNoticeOnePath: however a member's leave is learnt (the
// notice before memberlist's death, or the notice for a member already
// held failed), the event and Status agree: one EventLeave whose metadata
// is exactly what Status then reports, with Leaving set, and the member's
// state is StateLeft. The two paths used to build the status separately,
// and the first one stored the metadata without Leaving while the event
// said Leaving.
func TestGossipLeaveNoticeOnePath(t *testing.T) {
	tests := []struct {
		name string
		// steps feed memberlist's event path and the delegate in order.
		steps []string
	}{
		{"notice then death", []string{"join", "notice", "death"}},
		{"death then notice", []string{"join", "death", "notice"}},
		{"notice before join is forgotten by the join", []string{"notice", "join", "death-fails"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := start(t, testConfig("n0"))
			sub, cancel := g.Subscribe()
			defer cancel()
			waitEvent(t, sub, "own join", func(e Event) bool { return e.Kind == EventJoin && e.Node.ID == "n0" })
			meta := NodeMeta{ID: "n1", GRPCAddr: "127.0.0.1:11", RaftAddr: "127.0.0.1:21", Incarnation: 7}
			b, err := meta.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			node := &memberlist.Node{Name: "n1", Addr: net.IPv4(127, 0, 0, 9), Port: 7946, Meta: b}
			var last Event
			for _, step := range tc.steps {
				switch step {
				case "join":
					g.queue.NotifyJoin(node)
					last = waitEvent(t, sub, "n1 join", func(e Event) bool { return e.Node.ID == "n1" })
					if last.Kind != EventJoin {
						t.Fatalf("got %v, want join", last.Kind)
					}
				case "notice":
					(*metaDelegate)(g).NotifyMsg(append([]byte{msgLeaving}, "n1"...))
				case "death", "death-fails":
					g.queue.NotifyLeave(node)
				}
			}
			want := EventLeave
			if tc.steps[len(tc.steps)-1] == "death-fails" {
				want = EventFail
			}
			last = waitEvent(t, sub, "n1 gone", func(e Event) bool {
				return e.Node.ID == "n1" && (e.Kind == EventLeave || e.Kind == EventFail) &&
					(want == EventFail || e.Kind == EventLeave)
			})
			if last.Kind != want {
				t.Fatalf("event %v, want %v", last.Kind, want)
			}
			st := statusOf(g, "n1")
			if st == nil {
				t.Fatal("n1 not in Status")
			}
			wantState := StateLeft
			if want == EventFail {
				wantState = StateFailed
			}
			if st.State != wantState || st.Meta != last.Node || st.Meta.Leaving != (want == EventLeave) {
				t.Fatalf("status %+v (state %v) after event %+v; want state %v and the event's metadata", st.Meta, st.State, last.Node, wantState)
			}
			if st.Meta.Incarnation != 7 || st.Meta.GossipAddr != "127.0.0.9:7946" {
				t.Fatalf("status lost the member's metadata: %+v", st.Meta)
			}
		})
	}
}
