package meta

import (
	"reflect"
	"testing"
)

// TestDefaultConfig: a Config with only the required fields gets exactly
// DefaultConfig's values, and Validate refuses a missing one.
func TestDefaultConfig(t *testing.T) {
	got, err := Config{NodeID: "n", DataDir: "d"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.NodeID, want.DataDir, want.Logger = "n", "d", got.Logger
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults\n%+v\nDefaultConfig\n%+v", got, want)
	}
	for _, bad := range []Config{{}, {NodeID: "n"}, {DataDir: "d"}, {NodeID: "n", DataDir: "d", BootstrapExpect: -1}} {
		if bad.Validate() == nil {
			t.Errorf("Validate took %+v", bad)
		}
	}
}
