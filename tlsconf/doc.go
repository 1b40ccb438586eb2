// Package tlsconf turns PEM files named in a config into the mutual-TLS
// configurations kvmesh needs: gRPC servers that require and verify client
// certificates, gRPC clients that verify the server and present their own
// certificate, node-to-node links that do both and accept only node
// certificates (gRPC, and raft through package meta's stream layer, which
// lives there so that the client does not link hashicorp/raft).
// It also makes a throwaway CA and certificates for trying a secure
// cluster out (`kvmesh certs`).
//
// Identity is carried in the certificate: every certificate issued here
// names its role in Subject.OrganizationalUnit (NodeOU or ClientOU), so a
// client certificate from the cluster CA can call the client API but
// cannot join Raft or call the peer API. Plaintext is possible only when a
// Config says Insecure explicitly, and it is logged as a warning.
package tlsconf
