package main

import (
	"context"
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

// certsCmd is `kvmesh certs`: a CA (made on first use, reused after) and
// node and client certificates in a directory (tlsconf.GenerateFiles).
func certsCmd(_ context.Context, e *env, args []string) error {
	fs := e.flags("certs")
	dir := fs.String("dir", "pki", "directory for ca.pem, ca-key.pem and NAME.pem / NAME-key.pem")
	var nodes, clients listFlag
	fs.Var(&nodes, "node", "NAME=HOST[,HOST...]: a node certificate valid for those addresses (repeatable)")
	fs.Var(&clients, "client", "NAME: a client certificate (repeatable)")
	if _, err := e.parse(fs, args, 0, 0); err != nil {
		return err
	}
	reqs, err := certRequests(nodes, clients)
	if err != nil {
		return usagef("certs: %v", err)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	written, err := tlsconf.GenerateFiles(*dir, reqs...)
	if perr := printWritten(e, written); err == nil {
		err = perr
	}
	return err
}

// printWritten prints the files a command wrote: "wrote PATH" lines, or
// {"wrote": [...]}.
func printWritten(e *env, paths []string) error {
	if paths == nil {
		paths = []string{}
	}
	return e.print(map[string][]string{"wrote": paths}, func(w io.Writer) error {
		for _, p := range paths {
			fmt.Fprintln(w, "wrote", p)
		}
		return nil
	})
}

// gossipKeyNew is `kvmesh gossip-key new FILE`: a new keyring file with
// one random key.
func gossipKeyNew(e *env, file string) error {
	key, err := gossipkey.Generate()
	if err != nil {
		return err
	}
	if err := gossipkey.WriteFile(file, key); err != nil {
		return err
	}
	return printWritten(e, []string{file})
}

// secFlags are the client's TLS and token flags.
type secFlags struct {
	tls   tlsconf.Config
	token string
}

func (s *secFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.tls.CAFile, "ca", s.tls.CAFile, "cluster CA certificate (PEM; $KVMESH_CA); with -cert and -key: mutual TLS")
	fs.StringVar(&s.tls.CertFile, "cert", s.tls.CertFile, "client certificate (PEM; $KVMESH_CERT)")
	fs.StringVar(&s.tls.KeyFile, "key", s.tls.KeyFile, "client key (PEM; $KVMESH_KEY)")
	fs.StringVar(&s.tls.ServerName, "server-name", s.tls.ServerName, "name checked in node certificates instead of the dialed host")
	fs.StringVar(&s.token, "token", s.token, "API token ($KVMESH_TOKEN)")
	fs.BoolVar(&s.tls.Insecure, "insecure", s.tls.Insecure, "allow sending -token without TLS")
}

// config is cfg with the TLS identity and token.
func (s *secFlags) config(cfg client.Config) client.Config {
	cfg.TLS, cfg.Token = s.tls, s.token
	return cfg
}
