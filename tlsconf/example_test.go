package tlsconf_test

import (
	"log"

	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/tlsconf"
)

// Wiring a node: one TLS identity for the gRPC server, for dialing peers
// and for Raft.
func Example() {
	tl, err := tlsconf.New(tlsconf.Config{
		CAFile:   "/etc/kvmesh/pki/ca.pem",
		CertFile: "/etc/kvmesh/pki/n1.pem",
		KeyFile:  "/etc/kvmesh/pki/n1-key.pem",
	})
	if err != nil {
		log.Fatal(err)
	}
	// gRPC server: clients and peers must present a CA-signed certificate.
	srv := grpc.NewServer(grpc.Creds(tl.ServerCredentials()))
	defer srv.Stop()

	// Dialing a peer: the server must hold a node certificate.
	cc, err := grpc.NewClient("10.0.0.12:7000", grpc.WithTransportCredentials(tl.NodeClientCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()

	// Raft: meta.Config.TLS = tl carries raft over the same identity.
}
