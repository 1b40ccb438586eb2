package node

import (
	"net"
	"testing"

	"google.golang.org/grpc/peer"
)

func TestLocalPeer(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 11), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4(192, 168, 1, 2), Port: 1}, false},
		{&net.UnixAddr{Name: "/run/kvmesh.sock", Net: "unix"}, true},
		{nil, false},
	} {
		ctx := t.Context()
		if tc.addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: tc.addr})
		}
		if got := localPeer(ctx); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.addr, got, tc.want)
		}
	}
}
