package client

import (
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/tlsconf"
)

// Config configures New. Zero fields take the documented defaults.
type Config struct {
	// Seeds are gRPC addresses (host:port) of any cluster members
	// (required).
	Seeds []string
	// RPCTimeout bounds one attempt on one node. Default 10 s.
	RPCTimeout time.Duration
	// Attempts is how many rounds over a request's replicas are tried,
	// with a ring refresh and a backoff between rounds. Default 4.
	Attempts int
	// Backoff is the first pause between rounds; it doubles up to
	// MaxBackoff. Defaults 50 ms and 1 s.
	Backoff, MaxBackoff time.Duration
	// FrameBytes is the data frame size of Put. Default
	// api.DefaultFrameBytes.
	FrameBytes int
	// Limits bound the entries Get accepts. Zero means
	// chunk.DefaultLimits.
	Limits chunk.Limits
	// DialOptions are added to every connection (tests use bufconn
	// dialers).
	DialOptions []grpc.DialOption
	// TLS names the CA, client certificate and key for a cluster running
	// mutual TLS (a client certificate from `kvmesh certs -client`). No
	// files means plaintext, for nodes started with Insecure.
	TLS tlsconf.Config
	// Token is an API token ("<id>.<secret>") sent on every call as
	// "authorization: Bearer"; only over TLS unless TLS.Insecure is set.
	Token string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultConfig is the configuration of every field New defaults: the
// values a zero field takes. The caller sets Seeds (and TLS and Token for
// a secured cluster) before New.
func DefaultConfig() Config {
	return Config{
		RPCTimeout: 10 * time.Second,
		Attempts:   4,
		Backoff:    50 * time.Millisecond,
		MaxBackoff: time.Second,
		FrameBytes: api.DefaultFrameBytes,
		Limits:     chunk.DefaultLimits,
	}
}

// Validate reports what New would refuse before dialing: no seeds, or TLS
// files it cannot use.
func (c Config) Validate() error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	_, err = DialOptions(c)
	return err
}

// withDefaults checks c and gives its zero (or negative) fields
// DefaultConfig's values.
func (c Config) withDefaults() (Config, error) {
	if len(c.Seeds) == 0 {
		return c, errors.New("client: Config.Seeds is empty")
	}
	d := DefaultConfig()
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = d.RPCTimeout
	}
	if c.Attempts <= 0 {
		c.Attempts = d.Attempts
	}
	if c.Backoff <= 0 {
		c.Backoff = d.Backoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = d.MaxBackoff
	}
	if c.FrameBytes <= 0 {
		c.FrameBytes = d.FrameBytes
	}
	if c.Limits == (chunk.Limits{}) {
		c.Limits = d.Limits
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}
