package node_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/kvmesh/kvmesh/node/nodetest"
)

// BenchmarkRESP measures one connection's SET of new keys (written once,
// as LMCache writes), SET over a key's value, and GET, 4 KiB values,
// through the door of a 3-node loopback cluster (R=3 W=2), one command at
// a time: the latency of each.
func BenchmarkRESP(b *testing.B) {
	nodes := startCluster(b, 3)
	c := dialRESP(b, nodetest.ServeRESP(b, nodes[0]))
	value := make([]byte, 4<<10)
	set := func(key string) {
		if err := c.Command([]byte("SET"), []byte(key), value); err != nil {
			b.Fatal(err)
		}
		if got, err := c.Reply(nil); err != nil || string(got) != "OK" {
			b.Fatalf("SET: %q %v", got, err)
		}
	}
	set("warm-up") // registers the opaque model
	run := 0
	b.Run("set-new", func(b *testing.B) {
		run++
		for i := range b.N {
			set(fmt.Sprintf("new-%d-%d", run, i))
		}
	})
	b.Run("set-replace", func(b *testing.B) {
		for i := range b.N {
			value[0] = byte(i)
			set("replaced")
		}
	})
	for i := range 64 {
		set("get-" + strconv.Itoa(i))
	}
	b.Run("get", func(b *testing.B) {
		for i := range b.N {
			if _, err := c.Do(nil, "GET", "get-"+strconv.Itoa(i%64)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
