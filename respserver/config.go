package respserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Config configures a Server. DefaultConfig fills every field but
// Backend; zero fields of a Config passed to New take its values.
type Config struct {
	// Backend stores the values (required).
	Backend Backend
	// TLS, when set, serves RESP over TLS with this configuration.
	TLS *tls.Config
	// MaxBulkBytes bounds one argument (a key or a value).
	MaxBulkBytes int
	// MaxArgs bounds the arguments of one command, its name included.
	MaxArgs int
	// MaxCommandBytes bounds the bytes of one command's arguments.
	MaxCommandBytes int
	// MaxBufferedBytes bounds the argument bytes that all connections
	// together hold while their commands arrive and run; a command that
	// would pass it is refused and its connection closed.
	MaxBufferedBytes int
	// MaxInlineBytes bounds one line: an inline command or a length.
	MaxInlineBytes int
	// MaxClients bounds the open connections; more are refused.
	MaxClients int
	// MaxInFlight bounds the commands running at once over all
	// connections (each SET opens streams to W replicas, which peers
	// limit per caller); more wait their turn.
	MaxInFlight int
	// IdleTimeout closes a connection that starts no command for this long.
	IdleTimeout time.Duration
	// CommandTimeout bounds the time from a command's first byte to its
	// last, so a slow client cannot hold its arguments' memory.
	CommandTimeout time.Duration
	// WriteTimeout bounds the writing of one batch of replies.
	WriteTimeout time.Duration
	// ExecTimeout bounds one command's work in the Backend.
	ExecTimeout time.Duration
	// Info adds lines ("name:value") to INFO's kvmesh section.
	Info func() []string
	// Refused is told of every refusal (reason as the node's
	// kvmesh_requests_refused_total says it); nil: none.
	Refused func(command, reason string)
	// Metrics, when set, counts commands and connections.
	Metrics *Metrics
	// Logger logs connection errors; nil is slog.Default().
	Logger *slog.Logger
}

// DefaultConfig is the configuration a zero field stands for.
func DefaultConfig() Config {
	return Config{
		MaxBulkBytes:     64 << 20,
		MaxArgs:          4096,
		MaxCommandBytes:  256 << 20,
		MaxBufferedBytes: 1 << 30,
		MaxInlineBytes:   64 << 10,
		MaxClients:       1024,
		MaxInFlight:      16,
		IdleTimeout:      10 * time.Minute,
		CommandTimeout:   60 * time.Second,
		WriteTimeout:     60 * time.Second,
		ExecTimeout:      30 * time.Second,
	}
}

// withDefaults returns c with zero fields set from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setD := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.MaxBulkBytes, d.MaxBulkBytes)
	set(&c.MaxArgs, d.MaxArgs)
	set(&c.MaxCommandBytes, d.MaxCommandBytes)
	set(&c.MaxBufferedBytes, d.MaxBufferedBytes)
	set(&c.MaxInlineBytes, d.MaxInlineBytes)
	set(&c.MaxClients, d.MaxClients)
	set(&c.MaxInFlight, d.MaxInFlight)
	setD(&c.IdleTimeout, d.IdleTimeout)
	setD(&c.CommandTimeout, d.CommandTimeout)
	setD(&c.WriteTimeout, d.WriteTimeout)
	setD(&c.ExecTimeout, d.ExecTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// ErrInvalidConfig is wrapped by Validate's errors.
var ErrInvalidConfig = errors.New("respserver: invalid config")

// Validate reports whether c (with defaults applied) can run a server.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Backend == nil:
		return fmt.Errorf("%w: no Backend", ErrInvalidConfig)
	case c.MaxBulkBytes < 0 || c.MaxArgs < 0 || c.MaxCommandBytes < 0 || c.MaxBufferedBytes < 0 || c.MaxInlineBytes < 0 || c.MaxClients < 0 || c.MaxInFlight < 0:
		return fmt.Errorf("%w: a negative limit", ErrInvalidConfig)
	case c.MaxInlineBytes < 64:
		return fmt.Errorf("%w: MaxInlineBytes %d is under 64", ErrInvalidConfig, c.MaxInlineBytes)
	case c.MaxCommandBytes > c.MaxBufferedBytes:
		return fmt.Errorf("%w: MaxCommandBytes %d over MaxBufferedBytes %d", ErrInvalidConfig, c.MaxCommandBytes, c.MaxBufferedBytes)
	case c.IdleTimeout < 0 || c.CommandTimeout < 0 || c.WriteTimeout < 0 || c.ExecTimeout < 0:
		return fmt.Errorf("%w: a negative timeout", ErrInvalidConfig)
	}
	return nil
}
