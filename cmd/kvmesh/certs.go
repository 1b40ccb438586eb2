package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gossip/gossipkey"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// certRequests turns -node NAME=HOST,HOST and -client NAME flags into
// certificate requests.
func certRequests(nodes, clients []string) ([]tlsconf.CertRequest, error) {
	var reqs []tlsconf.CertRequest
	for _, n := range nodes {
		name, hosts, _ := strings.Cut(n, "=")
		if name == "" {
			return nil, fmt.Errorf("-node %q: want NAME=HOST[,HOST...]", n)
		}
		var hs []string
		for _, h := range strings.Split(hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hs = append(hs, h)
			}
		}
		if len(hs) == 0 {
			return nil, fmt.Errorf("-node %q: a node certificate needs the addresses or names peers dial it by", n)
		}
		reqs = append(reqs, tlsconf.CertRequest{Name: name, Hosts: hs, Usage: tlsconf.UsageNode})
	}
	for _, c := range clients {
		if c == "" || strings.ContainsAny(c, "=/") {
			return nil, fmt.Errorf("-client %q: want a plain name", c)
		}
		reqs = append(reqs, tlsconf.CertRequest{Name: c, Usage: tlsconf.UsageClient})
	}
	return reqs, nil
}

// certs is `kvmesh certs`: a CA (made on first use, reused after) and node
// and client certificates in a directory (tlsconf.GenerateFiles).
func certs(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "pki", "directory for ca.pem, ca-key.pem and NAME.pem / NAME-key.pem")
	var nodes, clients listFlag
	fs.Var(&nodes, "node", "NAME=HOST[,HOST...]: a node certificate valid for those addresses (repeatable)")
	fs.Var(&clients, "client", "NAME: a client certificate (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("certs: unexpected argument %q", fs.Arg(0))
	}
	reqs, err := certRequests(nodes, clients)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	written, err := tlsconf.GenerateFiles(*dir, reqs...)
	for _, p := range written {
		fmt.Fprintln(stdout, "wrote", p)
	}
	return err
}

// gossipKey is `kvmesh gossip-key FILE`: a new keyring file with one
// random key.
func gossipKey(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: kvmesh gossip-key FILE")
	}
	key, err := gossipkey.Generate()
	if err != nil {
		return err
	}
	if err := gossipkey.WriteFile(args[0], key); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "wrote", args[0])
	return nil
}

// secFlags are the client's TLS and token flags.
type secFlags struct {
	tls   tlsconf.Config
	token string
}

func (s *secFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.tls.CAFile, "ca", os.Getenv("KVMESH_CA"), "cluster CA certificate (PEM; default $KVMESH_CA); with -cert and -key: mutual TLS")
	fs.StringVar(&s.tls.CertFile, "cert", os.Getenv("KVMESH_CERT"), "client certificate (PEM; default $KVMESH_CERT)")
	fs.StringVar(&s.tls.KeyFile, "key", os.Getenv("KVMESH_KEY"), "client key (PEM; default $KVMESH_KEY)")
	fs.StringVar(&s.tls.ServerName, "server-name", "", "name checked in node certificates instead of the dialed host")
	fs.StringVar(&s.token, "token", os.Getenv("KVMESH_TOKEN"), "API token (default $KVMESH_TOKEN)")
	fs.BoolVar(&s.tls.Insecure, "insecure", false, "allow sending -token without TLS")
}

// config is cfg with the TLS identity and token.
func (s *secFlags) config(cfg client.Config) client.Config {
	cfg.TLS, cfg.Token = s.tls, s.token
	return cfg
}
