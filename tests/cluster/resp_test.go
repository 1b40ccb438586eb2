package cluster

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// redisTool returns the path of a redis-tools command (redis-cli,
// redis-benchmark); it skips when it is missing (make tools installs it).
func redisTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s missing (Debian's redis-tools; make tools installs it): %v", name, err)
	}
	return p
}

// runTool runs a command with stdin from a file (or none) and returns its
// stdout; a failure or a run past 2 minutes fails the test.
func runTool(t *testing.T, stdin string, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		f, err := os.Open(stdin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.Stdin = f
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", filepath.Base(name), args, err, stderr.Bytes())
	}
	return out
}

// TestRESPRedisTools drives a node's Redis-protocol door with Debian's
// redis-cli and redis-benchmark, which no one here wrote: binary values of
// 0 B to 16 MiB come back byte-identical, bad commands get Redis errors,
// and a pipelined benchmark of 64 KiB SETs and GETs completes with every
// value stored.
func TestRESPRedisTools(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a process")
	}
	cli := redisTool(t, "redis-cli")
	bench := redisTool(t, "redis-benchmark")
	host := "127.0.0.61"
	checkBindable(t, host)
	bin := buildKvmeshd(t)
	p := start(t, bin, "r1", host, t.TempDir(), "-bootstrap", "-local-timing", "-dram", "256M", "-disk", "0", "-resp", host+":0")
	addr := p.Addr("resp")
	h, port, ok := strings.Cut(addr, ":")
	if !ok || h != host {
		t.Fatalf("resp address %q, want host %s", addr, host)
	}
	redis := func(stdin string, args ...string) []byte {
		return runTool(t, stdin, cli, append([]string{"-h", host, "-p", port}, args...)...)
	}

	rng := rand.New(rand.NewPCG(33, 1))
	dir := t.TempDir()
	for _, n := range []int{0, 1, 1000, 64 << 10, 1 << 20, 16 << 20} {
		value := make([]byte, n)
		for i := range value {
			value[i] = byte(rng.Uint32())
		}
		file := filepath.Join(dir, fmt.Sprint(n))
		if err := os.WriteFile(file, value, 0o600); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("bin:%d", n)
		if out := redis(file, "-x", "SET", key); string(out) != "OK\n" {
			t.Fatalf("SET of %d bytes: %q", n, out)
		}
		// --raw prints the bulk string and a newline.
		got := redis("", "--raw", "GET", key)
		if !bytes.Equal(got, append(value, '\n')) {
			t.Fatalf("GET of %d bytes: %d bytes back, not the value", n, len(got))
		}
		if out := redis("", "STRLEN", key); string(out) != fmt.Sprintf("%d\n", n) {
			t.Fatalf("STRLEN of %d bytes: %q", n, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG\n"},
		{[]string{"EXISTS", "bin:0", "bin:1", "none"}, "2\n"},
		{[]string{"TYPE", "bin:1"}, "string\n"},
		{[]string{"GET", "none"}, "\n"},
		{[]string{"-3", "GET", "none"}, "\n"},
		{[]string{"SETNX", "bin:1", "x"}, "0\n"},
		{[]string{"MSET", "m1", "a", "m2", "b"}, "OK\n"},
		{[]string{"MGET", "m1", "none", "m2"}, "a\n\nb\n"},
		{[]string{"DEL", "m1", "m2", "none"}, "2\n"},
		{[]string{"HGET", "h", "f"}, "ERR unknown command 'HGET', with args beginning with: 'h' 'f' \n"},
		{[]string{"SET", "k", "v", "EX", "10"}, "ERR SET option 'EX' is not supported by kvmesh (plain SET only)\n"},
		{[]string{"GET"}, "ERR wrong number of arguments for 'get' command\n"},
		{[]string{"AUTH", "secret"}, "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\n"},
	} {
		// redis-cli ends an error reply with a blank line.
		if got := redis("", tc.args...); strings.TrimRight(string(got), "\n") != strings.TrimRight(tc.want, "\n") {
			t.Errorf("redis-cli %q: %q, want %q", tc.args, got, tc.want)
		}
	}
	if got := redis("", "INFO"); !bytes.Contains(got, []byte("redis_version:")) || !bytes.Contains(got, []byte("node_id:r1")) {
		t.Errorf("INFO: %q", got)
	}

	out := runTool(t, "", bench, "-h", host, "-p", port, "-t", "set,get", "-d", "65536", "-P", "16", "-c", "8", "-n", "2000", "-q")
	for _, op := range []string{"SET", "GET"} {
		if !regexp.MustCompile(`(?m)^` + op + `: [0-9.]+ requests per second`).Match(bytes.ReplaceAll(out, []byte("\r"), []byte("\n"))) {
			t.Fatalf("redis-benchmark: no %s result in\n%s", op, out)
		}
	}
	// redis-benchmark SETs key:__rand_int__ to its 64 KiB value.
	if got := redis("", "STRLEN", "key:__rand_int__"); string(got) != "65536\n" {
		t.Fatalf("the benchmark's value: STRLEN %q", got)
	}
}
