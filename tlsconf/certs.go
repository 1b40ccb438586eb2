package tlsconf

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Organizational units naming a certificate's role in the cluster.
const (
	// NodeOU marks a node certificate: it may serve, dial peers, join Raft
	// and call the peer API.
	NodeOU = "kvmesh-node"
	// ClientOU marks a client certificate: it may call the client API only.
	ClientOU = "kvmesh-client"
	// ServerOU marks a serving-only certificate (a front end that is not a
	// node).
	ServerOU = "kvmesh-server"
)

// Usage says what a certificate is for.
type Usage int

// Usages accepted by GenerateCert.
const (
	// UsageServer: serverAuth only (OU ServerOU).
	UsageServer Usage = iota + 1
	// UsageClient: clientAuth only (OU ClientOU).
	UsageClient
	// UsageNode: serverAuth and clientAuth (OU NodeOU); what every node
	// needs, since it both serves and dials its peers.
	UsageNode
)

func (u Usage) String() string {
	switch u {
	case UsageServer:
		return "server"
	case UsageClient:
		return "client"
	case UsageNode:
		return "node"
	}
	return fmt.Sprintf("Usage(%d)", int(u))
}

// ParseUsage parses "server", "client", "node" (or its alias "both").
func ParseUsage(s string) (Usage, error) {
	switch s {
	case "server":
		return UsageServer, nil
	case "client":
		return UsageClient, nil
	case "node", "both":
		return UsageNode, nil
	}
	return 0, fmt.Errorf("tlsconf: unknown certificate usage %q (want server, client or node)", s)
}

func (u Usage) extKeyUsage() ([]x509.ExtKeyUsage, string, error) {
	switch u {
	case UsageServer:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, ServerOU, nil
	case UsageClient:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, ClientOU, nil
	case UsageNode:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, NodeOU, nil
	}
	return nil, "", fmt.Errorf("tlsconf: invalid certificate usage %d", int(u))
}

// IsNodeCert reports whether a verified certificate names the node role.
func IsNodeCert(c *x509.Certificate) bool {
	return c != nil && slices.Contains(c.Subject.OrganizationalUnit, NodeOU)
}

// Default validity of generated certificates.
const (
	DefaultCAValidity   = 5 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
)

// CA is a certificate authority able to issue certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM and KeyPEM are the encoded forms, as written by WriteFiles.
	CertPEM, KeyPEM []byte
}

// Cert is an issued certificate with its private key.
type Cert struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// TLSCertificate returns the certificate as a tls.Certificate.
func (c *Cert) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(c.CertPEM, c.KeyPEM)
}

// GenerateCA makes a self-signed ECDSA P-256 CA named name, valid for
// DefaultCAValidity.
func GenerateCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"kvmesh"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(DefaultCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: parse CA: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// LoadCA reads a CA written by (*CA).WriteFiles (or any PEM CA certificate
// with an EC, RSA or Ed25519 key), so more certificates can be issued later.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: read CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: read CA key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA key pair: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("tlsconf: parse CA: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("tlsconf: %s is not a CA certificate", certFile)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("tlsconf: CA key cannot sign")
	}
	return &CA{Cert: cert, Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// CertRequest describes a certificate for (*CA).Issue.
type CertRequest struct {
	// Name is the subject common name: the node ID or client name.
	Name string
	// Hosts are DNS names and IP addresses put in the SANs; a peer dialing
	// this certificate's holder verifies the dialed host against them.
	Hosts []string
	Usage Usage
	// NotBefore defaults to a minute ago, NotAfter to NotBefore +
	// DefaultCertValidity (tests set them to make expired certificates).
	NotBefore, NotAfter time.Time
}

// GenerateCert issues a certificate for name, valid for hosts (DNS names or
// IP addresses), for usage, valid for DefaultCertValidity.
func GenerateCert(ca *CA, name string, hosts []string, usage Usage) (*Cert, error) {
	return ca.Issue(CertRequest{Name: name, Hosts: hosts, Usage: usage})
}

// Issue signs a new ECDSA P-256 certificate.
func (ca *CA) Issue(req CertRequest) (*Cert, error) {
	if req.Name == "" {
		return nil, errors.New("tlsconf: certificate needs a name")
	}
	eku, ou, err := req.Usage.extKeyUsage()
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	nb := req.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Minute)
	}
	na := req.NotAfter
	if na.IsZero() {
		na = nb.Add(DefaultCertValidity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.Name, Organization: []string{"kvmesh"}, OrganizationalUnit: []string{ou}},
		NotBefore:    nb,
		NotAfter:     na,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  eku,
	}
	for _, h := range req.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: sign %s: %w", req.Name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: parse %s: %w", req.Name, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Cert{Cert: cert, CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// WriteFiles writes dir/ca.pem (0644) and dir/ca-key.pem (0600) and
// returns their paths. Existing files are not overwritten.
func (ca *CA) WriteFiles(dir string) (certFile, keyFile string, err error) {
	return writePair(dir, "ca", ca.CertPEM, ca.KeyPEM)
}

// WriteFiles writes dir/name.pem (0644) and dir/name-key.pem (0600) and
// returns their paths. Existing files are not overwritten.
func (c *Cert) WriteFiles(dir, name string) (certFile, keyFile string, err error) {
	return writePair(dir, name, c.CertPEM, c.KeyPEM)
}

func writePair(dir, name string, certPEM, keyPEM []byte) (string, string, error) {
	if name == "" || filepath.Base(name) != name {
		return "", "", fmt.Errorf("tlsconf: invalid file name %q", name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("tlsconf: %w", err)
	}
	certFile := filepath.Join(dir, name+".pem")
	keyFile := filepath.Join(dir, name+"-key.pem")
	// The key first: a key without its certificate is harmless, the other
	// way round leaves an unusable pair that blocks a rerun.
	if err := writeNew(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("tlsconf: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("tlsconf: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("tlsconf: write %s: %w", path, err)
	}
	return nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("tlsconf: serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// GenerateFiles is what `kvmesh certs` does: it loads the CA in
// dir/ca.pem and dir/ca-key.pem, or makes one named "kvmesh CA" there when
// neither exists, then issues and writes a certificate for each request as
// dir/<Name>.pem and dir/<Name>-key.pem (keys 0600). Existing files are
// never overwritten. It returns the paths written.
func GenerateFiles(dir string, reqs ...CertRequest) ([]string, error) {
	caFile, caKey := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	var written []string
	ca, err := LoadCA(caFile, caKey)
	if errors.Is(err, os.ErrNotExist) {
		if _, e1 := os.Stat(caFile); !errors.Is(e1, os.ErrNotExist) {
			return nil, fmt.Errorf("tlsconf: %s exists without its key %s", caFile, caKey)
		}
		if ca, err = GenerateCA("kvmesh CA"); err != nil {
			return nil, err
		}
		if _, _, err = ca.WriteFiles(dir); err != nil {
			return nil, err
		}
		written = append(written, caFile, caKey)
	} else if err != nil {
		return nil, err
	}
	for _, r := range reqs {
		c, err := ca.Issue(r)
		if err != nil {
			return written, err
		}
		cf, kf, err := c.WriteFiles(dir, r.Name)
		if err != nil {
			return written, err
		}
		written = append(written, cf, kf)
	}
	return written, nil
}
