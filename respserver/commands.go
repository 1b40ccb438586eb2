package respserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// command is one command the door knows: its name, its arity (negative:
// at least -arity arguments, the name included), whether it runs before
// AUTH, and its handler, which writes exactly one reply.
type command struct {
	name   string
	arity  int
	noAuth bool
	run    func(ctx context.Context, cs *conn, out *replies, args [][]byte) error
	// keys returns the keys a command reads or writes; nil for a command
	// that is not run beside others (one that changes the connection, or
	// names no key).
	keys func(args [][]byte) [][]byte
}

func firstKey(args [][]byte) [][]byte { return args[1:2] }
func allKeys(args [][]byte) [][]byte  { return args[1:] }
func pairKeys(args [][]byte) [][]byte {
	keys := make([][]byte, 0, len(args)/2)
	for i := 1; i < len(args); i += 2 {
		keys = append(keys, args[i])
	}
	return keys
}

var commands = map[string]*command{}

func init() {
	for _, c := range []*command{
		{name: "PING", arity: -1, noAuth: true, run: ping},
		{name: "HELLO", arity: -1, noAuth: true, run: hello},
		{name: "AUTH", arity: -2, noAuth: true, run: authCmd},
		{name: "QUIT", arity: 1, noAuth: true, run: func(_ context.Context, _ *conn, out *replies, _ [][]byte) error { out.simple("OK"); return nil }},
		{name: "GET", arity: 2, run: get, keys: firstKey},
		{name: "SET", arity: -3, run: set, keys: firstKey},
		{name: "SETNX", arity: 3, run: setnx, keys: firstKey},
		{name: "EXISTS", arity: -2, run: exists, keys: allKeys},
		{name: "DEL", arity: -2, run: del, keys: allKeys},
		{name: "MGET", arity: -2, run: mget, keys: allKeys},
		{name: "MSET", arity: -3, run: mset, keys: pairKeys},
		{name: "STRLEN", arity: 2, run: strlen, keys: firstKey},
		{name: "TYPE", arity: 2, run: typeCmd, keys: firstKey},
		{name: "INFO", arity: -1, run: info},
	} {
		commands[c.name] = c
	}
}

// run runs one command and reports whether the connection ends after its
// reply (QUIT).
func (cs *conn) run(ctx context.Context, out *replies, args [][]byte) (quit bool) {
	name := strings.ToUpper(string(args[0]))
	c, ok := commands[name]
	label := name
	if !ok {
		label = "unknown"
	}
	start := time.Now()
	result := "ok"
	defer func() {
		if m := cs.s.cfg.Metrics; m != nil {
			m.commands.WithLabelValues(label, result).Inc()
			m.seconds.WithLabelValues(label).Observe(time.Since(start).Seconds())
		}
	}()
	fail := func(reason, msg string) {
		result = "error"
		cs.s.refused(label, reason)
		out.err(msg)
	}
	switch {
	case !ok:
		fail("invalid_argument", fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", clip(args[0]), argsPreview(args[1:])))
		return false
	case (c.arity > 0 && len(args) != c.arity) || (c.arity < 0 && len(args) < -c.arity):
		fail("invalid_argument", fmt.Sprintf("ERR wrong number of arguments for '%s' command", strings.ToLower(name)))
		return false
	case cs.ks == nil && !c.noAuth:
		fail("unauthenticated", "NOAUTH Authentication required.")
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, cs.s.cfg.ExecTimeout)
	defer cancel()
	select {
	case cs.s.running <- struct{}{}:
	case <-cctx.Done():
		result = "error"
		out.err("ERR timed out waiting for a turn: " + cctx.Err().Error())
		return false
	}
	err := cs.exec(cctx, c, out, args)
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		result = "nil"
	default:
		reason, msg := errorReply(err)
		fail(reason, msg)
	}
	return name == "QUIT"
}

// exec runs a command holding a running slot; a panic in it is its error,
// not the node's end.
func (cs *conn) exec(ctx context.Context, c *command, out *replies, args [][]byte) (err error) {
	defer func() {
		<-cs.s.running
		if r := recover(); r != nil {
			cs.s.cfg.Logger.Error("respserver: panic in a command", "command", c.name, "panic", r)
			err = fmt.Errorf("internal error in %s", c.name)
		}
	}()
	return c.run(ctx, cs, out, args)
}

// errorReply is the refusal reason ("" for a failure that is no refusal)
// and the error reply of a command's error.
func errorReply(err error) (reason, msg string) {
	var se syntaxError
	switch {
	case errors.As(err, &se):
		return "invalid_argument", "ERR " + string(se)
	case errors.Is(err, errNoProto):
		return "invalid_argument", "NOPROTO unsupported protocol version"
	case errors.Is(err, ErrBadToken):
		return "unauthenticated", "WRONGPASS invalid username-password pair or user is disabled."
	case errors.Is(err, ErrNoAuth):
		return "invalid_argument", "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
	case errors.Is(err, ErrAuthRequired):
		return "unauthenticated", "NOAUTH Authentication required."
	case errors.Is(err, ErrNoPerm):
		return "permission_denied", "NOPERM " + err.Error()
	case errors.Is(err, errBusy):
		return "resource_exhausted", "BUSY " + err.Error()
	case errors.Is(err, ErrTooLarge):
		return "resource_exhausted", "ERR " + err.Error()
	case errors.Is(err, ErrOtherValue):
		return "failed_precondition", "ERR " + err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "", "ERR timed out: " + err.Error()
	}
	return "", "ERR " + err.Error()
}

// syntaxError is a command's own argument error, its message the reply's.
type syntaxError string

func (e syntaxError) Error() string { return string(e) }

// clip is an argument as an error reply quotes it: at most 128 bytes.
func clip(b []byte) string {
	if len(b) > 128 {
		b = b[:128]
	}
	return string(b)
}

func argsPreview(args [][]byte) string {
	var sb strings.Builder
	for i, a := range args {
		if i == 8 || sb.Len() > 128 {
			break
		}
		fmt.Fprintf(&sb, "'%s' ", clip(a))
	}
	return sb.String()
}

func ping(_ context.Context, cs *conn, out *replies, args [][]byte) error {
	switch len(args) {
	case 1:
		out.simple("PONG")
	case 2:
		out.bulk(args[1])
	default:
		return syntaxError("wrong number of arguments for 'ping' command")
	}
	return nil
}

// hello answers HELLO [protover [AUTH username password] [SETNAME name]].
func hello(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	proto := out.proto
	if len(args) > 1 {
		v, err := strconv.Atoi(string(args[1]))
		if err != nil {
			return syntaxError("Protocol version is not an integer or out of range")
		}
		if v != 2 && v != 3 {
			return errNoProto
		}
		proto = v
	}
	for i := 2; i < len(args); i++ {
		switch strings.ToUpper(string(args[i])) {
		case "AUTH":
			if i+2 >= len(args) {
				return syntaxError("syntax error")
			}
			if err := cs.auth(ctx, args[i+2]); err != nil {
				return err
			}
			i += 2
		case "SETNAME":
			if i+1 >= len(args) {
				return syntaxError("syntax error")
			}
			i++
		default:
			return syntaxError("syntax error")
		}
	}
	if cs.ks == nil {
		return ErrAuthRequired
	}
	out.proto = proto
	out.mapLen(7)
	out.bulkString("server")
	out.bulkString("redis")
	out.bulkString("version")
	out.bulkString(redisVersion)
	out.bulkString("proto")
	out.int(proto)
	out.bulkString("id")
	out.int(int(cs.id))
	out.bulkString("mode")
	out.bulkString("standalone")
	out.bulkString("role")
	out.bulkString("master")
	out.bulkString("modules")
	out.array(0)
	return nil
}

// redisVersion is the Redis version the door answers HELLO and INFO with:
// clients check it for the commands they may send, and the door answers
// the commands of this version that they send (the ones above).
const redisVersion = "7.0.0"

var errNoProto = errors.New("respserver: protocol version")

func authCmd(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	if len(args) > 3 {
		return syntaxError("syntax error")
	}
	if err := cs.auth(ctx, args[len(args)-1]); err != nil {
		return err
	}
	out.simple("OK")
	return nil
}

// auth opens the keyspace of token; the connection keeps its old one when
// the token is not valid.
func (cs *conn) auth(ctx context.Context, token []byte) error {
	ks, err := cs.s.cfg.Backend.Open(ctx, string(token))
	if err != nil {
		return err
	}
	cs.ks = ks
	return nil
}

func get(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	v, err := cs.ks.Get(ctx, args[1])
	if errors.Is(err, ErrNotFound) {
		out.null()
		return err
	}
	if err != nil {
		return err
	}
	if err := cs.holdReply(len(v)); err != nil {
		return err
	}
	cs.sent(len(v))
	out.bulk(v)
	return nil
}

func (cs *conn) sent(n int) {
	if m := cs.s.cfg.Metrics; m != nil {
		m.bytes.WithLabelValues("out").Add(float64(n))
	}
}

func (cs *conn) received(n int) {
	if m := cs.s.cfg.Metrics; m != nil {
		m.bytes.WithLabelValues("in").Add(float64(n))
	}
}

// set answers a plain SET; every option (EX, NX, GET, KEEPTTL, ...) is
// refused, since the door keeps no expiry and no conditions but SETNX's.
func set(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	if len(args) > 3 {
		return syntaxError(fmt.Sprintf("SET option '%s' is not supported by kvmesh (plain SET only)", clip(args[3])))
	}
	cs.received(len(args[2]))
	if err := cs.ks.Set(ctx, args[1], args[2]); err != nil {
		return err
	}
	out.simple("OK")
	return nil
}

func setnx(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	_, err := cs.ks.Len(ctx, args[1])
	if err == nil {
		out.int(0)
		return nil
	}
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	cs.received(len(args[2]))
	if err := cs.ks.Set(ctx, args[1], args[2]); err != nil {
		return err
	}
	out.int(1)
	return nil
}

func exists(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	n := 0
	for _, k := range args[1:] {
		_, err := cs.ks.Len(ctx, k)
		if err == nil {
			n++
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	out.int(n)
	return nil
}

func del(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	n := 0
	for _, k := range args[1:] {
		ok, err := cs.ks.Delete(ctx, k)
		if err != nil {
			return err
		}
		if ok {
			n++
		}
	}
	out.int(n)
	return nil
}

// mget reads every key before it writes the reply, so that an error is
// one error reply and not half an array.
func mget(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	vals := make([][]byte, len(args)-1)
	for i, k := range args[1:] {
		v, err := cs.ks.Get(ctx, k)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if err := cs.holdReply(len(v)); err != nil {
			return err
		}
		vals[i] = v
	}
	out.array(len(vals))
	for _, v := range vals {
		if v == nil {
			out.null()
			continue
		}
		cs.sent(len(v))
		out.bulk(v)
	}
	return nil
}

// mset stores the pairs in order; it is not atomic: on an error the
// pairs before it are stored.
func mset(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	if len(args)%2 != 1 {
		return syntaxError("wrong number of arguments for 'mset' command")
	}
	for i := 1; i < len(args); i += 2 {
		cs.received(len(args[i+1]))
		if err := cs.ks.Set(ctx, args[i], args[i+1]); err != nil {
			return err
		}
	}
	out.simple("OK")
	return nil
}

func strlen(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	n, err := cs.ks.Len(ctx, args[1])
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	out.int(n)
	return nil
}

func typeCmd(ctx context.Context, cs *conn, out *replies, args [][]byte) error {
	_, err := cs.ks.Len(ctx, args[1])
	switch {
	case err == nil:
		out.simple("string")
	case errors.Is(err, ErrNotFound):
		out.simple("none")
	default:
		return err
	}
	return nil
}

// info answers INFO with a server section and a kvmesh one, whatever
// section is asked for.
func info(_ context.Context, cs *conn, out *replies, _ [][]byte) error {
	var b bytes.Buffer
	b.WriteString("# Server\r\n")
	fmt.Fprintf(&b, "redis_version:%s\r\nredis_mode:standalone\r\n", redisVersion)
	cs.s.mu.Lock()
	clients := len(cs.s.conns)
	cs.s.mu.Unlock()
	fmt.Fprintf(&b, "\r\n# Clients\r\nconnected_clients:%d\r\nmaxclients:%d\r\n", clients, cs.s.cfg.MaxClients)
	b.WriteString("\r\n# kvmesh\r\n")
	fmt.Fprintf(&b, "proto_max_bulk_len:%d\r\nbuffered_request_bytes:%d\r\n", cs.s.cfg.MaxBulkBytes, cs.s.budget.used.Load())
	if cs.s.cfg.Info != nil {
		for _, l := range cs.s.cfg.Info() {
			b.WriteString(l)
			b.WriteString("\r\n")
		}
	}
	out.bulk(b.Bytes())
	return nil
}
