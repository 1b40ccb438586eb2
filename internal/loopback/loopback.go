// Package loopback picks loopback addresses for clusters that run on one
// machine (kvmesh local-cluster, kvmesh-demo), so their nodes get distinct
// hosts where the machine allows it.
package loopback

import (
	"fmt"
	"net"
)

// Hosts returns n loopback hosts: 127.0.0.11, .12, ... when this machine
// can bind them, else 127.0.0.1 for all.
func Hosts(n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("127.0.0.%d", 11+i)
		l, err := net.Listen("tcp", hosts[i]+":0")
		if err != nil || 11+n > 255 {
			for j := range hosts {
				hosts[j] = "127.0.0.1"
			}
			return hosts
		}
		l.Close()
	}
	return hosts
}
