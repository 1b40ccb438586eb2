package node

import "testing"

// TestDefaultConfig: a Config with only NodeID and DataDir gets
// DefaultConfig's fixed values, and Validate refuses what New refuses.
func TestDefaultConfig(t *testing.T) {
	got, err := Config{NodeID: "n", DataDir: "d"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if got.GRPCAddr != d.GRPCAddr || got.DRAMBytes != d.DRAMBytes || got.FrameBytes != d.FrameBytes ||
		got.RPCTimeout != d.RPCTimeout || got.Limits != d.Limits || got.MaxChunksPerRequest != d.MaxChunksPerRequest ||
		got.MaxStreamsPerClient != d.MaxStreamsPerClient || got.MaxUnaryPerClient != d.MaxUnaryPerClient {
		t.Errorf("defaults %+v, DefaultConfig %+v", got, d)
	}
	if got.BootstrapExpect != 1 || got.HTTPAddr != "127.0.0.1:0" {
		t.Errorf("BootstrapExpect %d, HTTPAddr %q: want 1 and the gRPC host's any port", got.BootstrapExpect, got.HTTPAddr)
	}
	for _, bad := range []Config{{}, {NodeID: "n"}, {DataDir: "d"}, {NodeID: "n", DataDir: "d", GRPCAddr: "no port"}} {
		if bad.Validate() == nil {
			t.Errorf("Validate took %+v", bad)
		}
	}
}
