package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ErrNotConfigured is returned by New when a Config names no PEM files and
// does not set Insecure: plaintext must be asked for, never fallen into.
var ErrNotConfigured = errors.New("tlsconf: no CA/cert/key files configured and Insecure not set")

// ErrNotNode is the handshake error when the peer's certificate, though
// signed by the cluster CA, is not a node certificate (OU NodeOU).
var ErrNotNode = errors.New("tlsconf: peer certificate is not a kvmesh node certificate")

// ErrRefused wraps the error of Config.Check when it refuses a
// certificate.
var ErrRefused = errors.New("tlsconf: certificate refused")

// Config names the PEM files of one process's TLS identity. It is meant to
// be embedded in node and client configs as is.
type Config struct {
	// CAFile is the cluster CA certificate (PEM, one or more): servers
	// verify client certificates against it, clients verify servers.
	CAFile string `json:"ca_file,omitempty"`
	// CertFile and KeyFile are this process's certificate (PEM, leaf
	// first, intermediates after) and private key (PEM).
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// Insecure turns TLS off: plaintext gRPC and Raft, no peer identity.
	// It must be set explicitly, cannot be combined with the files above,
	// and New logs a warning when it is set.
	Insecure bool `json:"insecure,omitempty"`
	// ServerName, if set, is the name clients and dialing nodes check in
	// the server's certificate instead of the host they dial (as Consul's
	// "server.<dc>.consul"): give every node certificate this name and
	// nodes can be dialed by any address. Default: the dialed host.
	ServerName string `json:"server_name,omitempty"`
	// Logger receives the insecure-mode warning and reload messages.
	// Default slog.Default().
	Logger *slog.Logger `json:"-"`
	// Check, if set, vets this process's own certificate once it verifies
	// against the CA: at New (prev nil) and at every Reload (prev the
	// certificate in use). An error refuses next (wrapped in ErrRefused):
	// New fails, Reload keeps prev. Nodes use it to hold a renewed
	// certificate to the identity rules they start with, which a plain
	// file swap and SIGHUP would otherwise bypass.
	Check func(prev, next *x509.Certificate) error `json:"-"`
}

// TLS is a loaded Config. Its tls.Configs read the certificate through a
// callback, so Reload (a renewed certificate and key, same CA) takes
// effect on the next handshake without rebuilding servers or clients. The
// CA is read once; changing it needs a restart.
type TLS struct {
	cfg  Config
	log  *slog.Logger
	pool *x509.CertPool
	cert atomic.Pointer[tls.Certificate]
	// reloads and failures count Reload's outcomes (not New's load).
	reloads, failures atomic.Uint64
}

// New loads cfg's files, or returns an insecure TLS (and logs a warning)
// when cfg.Insecure is set.
func New(cfg Config) (*TLS, error) {
	t := &TLS{cfg: cfg, log: cfg.Logger}
	if t.log == nil {
		t.log = slog.Default()
	}
	files := cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != ""
	switch {
	case cfg.Insecure && files:
		return nil, errors.New("tlsconf: Insecure set together with CA/cert/key files; choose one")
	case cfg.Insecure:
		t.log.Warn("tlsconf: TLS is OFF (insecure mode): gRPC and Raft traffic is plaintext and unauthenticated; " +
			"anyone who can reach these ports can read and write the KV cache and join the cluster")
		return t, nil
	case !files:
		return nil, ErrNotConfigured
	case cfg.CAFile == "" || cfg.CertFile == "" || cfg.KeyFile == "":
		return nil, errors.New("tlsconf: CAFile, CertFile and KeyFile are all required")
	}
	caPEM, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: read CA: %w", err)
	}
	t.pool = x509.NewCertPool()
	if !t.pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tlsconf: no certificate in %s", cfg.CAFile)
	}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

// Insecure reports whether TLS is off.
func (t *TLS) Insecure() bool { return t.cfg.Insecure }

// Reload re-reads CertFile and KeyFile, checks them as New does (CA,
// then Config.Check), logs the outcome and counts it (ReloadCounts). On
// error the previous certificate stays in use.
func (t *TLS) Reload() error {
	if t.cfg.Insecure {
		return nil
	}
	if err := t.load(); err != nil {
		t.failures.Add(1)
		t.log.Error("tlsconf: certificate reload refused; keeping the old certificate", "file", t.cfg.CertFile, "err", err)
		return err
	}
	t.reloads.Add(1)
	t.log.Info("tlsconf: certificate reloaded", "file", t.cfg.CertFile, "subject", t.Leaf().Subject.String())
	return nil
}

// ReloadCounts returns how many Reloads took effect and how many were
// refused or failed (the old certificate kept serving), for metrics.
func (t *TLS) ReloadCounts() (reloaded, failed uint64) {
	return t.reloads.Load(), t.failures.Load()
}

// load reads, verifies and checks the key pair and, if all pass, makes it
// the certificate in use. Concurrent loads are not serialised: each
// stores a pair that passed every check, and the last store wins.
func (t *TLS) load() error {
	pair, err := tls.LoadX509KeyPair(t.cfg.CertFile, t.cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("tlsconf: load key pair: %w", err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("tlsconf: parse %s: %w", t.cfg.CertFile, err)
		}
		pair.Leaf = leaf
	}
	// Catch a certificate from another CA at load time rather than as
	// every peer's handshake failure.
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: t.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("tlsconf: %s does not verify against %s: %w", t.cfg.CertFile, t.cfg.CAFile, err)
	}
	if t.cfg.Check != nil {
		if err := t.cfg.Check(t.Leaf(), leaf); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRefused, t.cfg.CertFile, err)
		}
	}
	t.cert.Store(&pair)
	return nil
}

// ReloadOnSignal calls Reload (which logs and counts the outcome)
// whenever the process receives one of sigs (default SIGHUP), until ctx
// is done. It blocks: run it on a goroutine the caller waits for. A
// refused reload keeps the old certificate.
func (t *TLS) ReloadOnSignal(ctx context.Context, sigs ...os.Signal) {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGHUP}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			_ = t.Reload() // logged and counted by Reload
		}
	}
}

// Leaf returns the current certificate, or nil in insecure mode.
func (t *TLS) Leaf() *x509.Certificate {
	if c := t.cert.Load(); c != nil {
		return c.Leaf
	}
	return nil
}

func (t *TLS) getCert(*tls.ClientHelloInfo) (*tls.Certificate, error) { return t.cert.Load(), nil }

func (t *TLS) getClientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return t.cert.Load(), nil
}

// ServerConfig is for a gRPC server: it requires a client certificate that
// verifies against the CA. It is nil in insecure mode.
func (t *TLS) ServerConfig() *tls.Config {
	if t.cfg.Insecure {
		return nil
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      t.pool,
		GetCertificate: t.getCert,
	}
}

// ClientConfig is for a gRPC client: it verifies the server against the CA
// (and ServerName when set) and presents this certificate. It is nil in
// insecure mode.
func (t *TLS) ClientConfig() *tls.Config {
	if t.cfg.Insecure {
		return nil
	}
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              t.pool,
		ServerName:           t.cfg.ServerName,
		GetClientCertificate: t.getClientCert,
	}
}

// NodeServerConfig is ServerConfig that also refuses any client whose
// certificate is not a node certificate: for listeners only nodes may use
// (Raft). It is nil in insecure mode.
func (t *TLS) NodeServerConfig() *tls.Config {
	c := t.ServerConfig()
	if c != nil {
		c.VerifyConnection = requireNode
	}
	return c
}

// NodeClientConfig is ClientConfig that also refuses a server whose
// certificate is not a node certificate: for node-to-node links (peer
// gRPC, Raft). It is nil in insecure mode.
func (t *TLS) NodeClientConfig() *tls.Config {
	c := t.ClientConfig()
	if c != nil {
		c.VerifyConnection = requireNode
	}
	return c
}

func requireNode(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 || !IsNodeCert(cs.PeerCertificates[0]) {
		return ErrNotNode
	}
	return nil
}

// ServerCredentials are the gRPC server's transport credentials
// (grpc.Creds): mutual TLS, or plaintext in insecure mode.
func (t *TLS) ServerCredentials() credentials.TransportCredentials {
	if t.cfg.Insecure {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.ServerConfig())
}

// ClientCredentials are a client's gRPC transport credentials
// (grpc.WithTransportCredentials): mutual TLS, or plaintext in insecure
// mode.
func (t *TLS) ClientCredentials() credentials.TransportCredentials {
	if t.cfg.Insecure {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.ClientConfig())
}

// NodeClientCredentials are a node's credentials for dialing its peers:
// like ClientCredentials, and the server must hold a node certificate.
func (t *TLS) NodeClientCredentials() credentials.TransportCredentials {
	if t.cfg.Insecure {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.NodeClientConfig())
}
