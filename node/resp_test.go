package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/resp"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/node/nodetest"
)

func dialRESP(t testing.TB, addr string) *resp.Conn {
	t.Helper()
	c, err := resp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func do(t testing.TB, c *resp.Conn, want string, args ...string) {
	t.Helper()
	got, err := c.Do(nil, args...)
	if err != nil {
		got = []byte("-" + err.Error())
	}
	if string(got) != want && !(strings.HasSuffix(want, "*") && strings.HasPrefix(string(got), strings.TrimSuffix(want, "*"))) {
		t.Fatalf("%q: %q, want %q", args, got, want)
	}
}

// TestRESPCluster: a value SET through one node's door is read back
// byte-identical through every node's, from the replicas; a SET replaces
// a value; DEL removes it everywhere.
func TestRESPCluster(t *testing.T) {
	nodes := startCluster(t, 3)
	var conns []*resp.Conn
	for _, n := range nodes {
		conns = append(conns, dialRESP(t, nodetest.ServeRESP(t, n)))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	value := make([]byte, 3<<20+17)
	for i := range value {
		value[i] = byte(rng.Uint32())
	}
	if err := conns[0].Command([]byte("SET"), []byte("bin\x00key"), value); err != nil {
		t.Fatal(err)
	}
	if got, err := conns[0].Reply(nil); err != nil || string(got) != "OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	for i, c := range conns {
		if err := c.Command([]byte("GET"), []byte("bin\x00key")); err != nil {
			t.Fatal(err)
		}
		got, err := c.Reply(nil)
		if err != nil || !bytes.Equal(got, value) {
			t.Fatalf("GET through node %d: %d bytes, %v; want the %d bytes SET", i, len(got), err, len(value))
		}
	}
	do(t, conns[1], "1", "EXISTS", "bin\x00key")
	do(t, conns[2], "3145745", "STRLEN", "bin\x00key")
	do(t, conns[0], "OK", "SET", "k", "one")
	do(t, conns[1], "OK", "SET", "k", "one")
	do(t, conns[2], "0", "SETNX", "k", "two")
	// A SET of a key that holds another value replaces it (a new
	// version), read through every node (docs/REDIS.md).
	for _, v := range []string{"one", "two", "three", "one"} {
		do(t, conns[0], "OK", "SET", "k2", v)
		for i, c := range conns {
			testutil.WaitForWithin(t, 10*time.Second, fmt.Sprintf("node %d to read %q", i, v), func() bool {
				got, err := c.Do(nil, "GET", "k2")
				return err == nil && string(got) == v
			})
		}
	}
	do(t, conns[2], "2", "DEL", "k", "bin\x00key", "missing")
	for _, c := range conns {
		if _, err := c.Do(nil, "GET", "k"); !errors.Is(err, resp.ErrNil) {
			t.Fatalf("GET after DEL: %v, want nil", err)
		}
	}
	do(t, conns[0], "OK", "SET", "k", "two")
	do(t, conns[1], "two", "GET", "k")
}

// TestRESPTokens: with tokens, a client must AUTH; its token's namespace
// is its keyspace and its scopes its commands; a revoked token stops at
// the next command.
func TestRESPTokens(t *testing.T) {
	cfg := nodetest.NodeConfig(t, "n1", nil)
	cfg.Insecure, cfg.Tokens = true, true
	n := nodetest.StartNode(t, cfg)
	testutil.WaitFor(t, "n1 ready", func() bool { return n.Ready() == nil })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	mint := func(s auth.Scope, ns ...string) (tok, id string) {
		tk, rec, err := auth.NewToken("resp", s, auth.Namespace(ns), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Meta().PutToken(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return tk.String(), rec.ID
	}
	rw := auth.ScopeRead | auth.ScopeWrite
	writerA, _ := mint(rw, "aa")
	readerA, readerAID := mint(auth.ScopeRead, "aa")
	writerB, _ := mint(rw, "bb")
	c := dialRESP(t, nodetest.ServeRESP(t, n))
	do(t, c, "PONG", "PING")
	do(t, c, "-NOAUTH Authentication required.", "GET", "k")
	do(t, c, "-WRONGPASS*", "AUTH", "not-a-token")
	do(t, c, "OK", "AUTH", writerA)
	do(t, c, "OK", "SET", "k", "a's value")
	do(t, c, "OK", "AUTH", "default", writerB)
	if _, err := c.Do(nil, "GET", "k"); !errors.Is(err, resp.ErrNil) {
		t.Fatalf("another namespace's GET: %v, want nil", err)
	}
	do(t, c, "OK", "AUTH", readerA)
	do(t, c, "a's value", "GET", "k")
	do(t, c, "-NOPERM*", "SET", "k", "x")
	do(t, c, "-NOPERM*", "DEL", "k")
	if err := n.Meta().DeleteToken(ctx, readerAID); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the revoked token refused", func() bool {
		_, err := c.Do(nil, "GET", "k")
		return err != nil && strings.HasPrefix(err.Error(), "WRONGPASS")
	})
}
