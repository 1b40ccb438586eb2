package kvtier

import "testing"

// TestDefaultConfig: Open keeps the configuration it runs by, every
// default filled (ReleaseBytes was once defaulted after the store copied
// its config), and Validate refuses what Open refuses.
func TestDefaultConfig(t *testing.T) {
	s, err := Open(Config{DRAMBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := DefaultConfig()
	c := s.cfg
	if c.PageSize != d.PageSize || c.DiskCodec != d.DiskCodec || c.Limits != d.Limits || c.Now == nil || c.Logger == nil {
		t.Errorf("store runs by %+v, DefaultConfig %+v", c, d)
	}
	if c.DoorkeeperBytes != 8<<20 || c.LendBytes != 2<<20 || c.ReleaseBytes != 1<<20 {
		t.Errorf("derived defaults: doorkeeper %d, lend %d, release %d", c.DoorkeeperBytes, c.LendBytes, c.ReleaseBytes)
	}
	for _, bad := range []Config{{}, {DRAMBytes: 1 << 20, DiskDir: t.TempDir()}} {
		if bad.Validate() == nil {
			t.Errorf("Validate took %+v", bad)
		}
	}
}
