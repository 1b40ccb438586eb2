package kern

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPTXFresh compiles inject.cu as `make cuda` does and fails when the
// committed PTX differs, then has ptxas assemble each file for its
// architecture. It skips where nvcc is missing (`make test` installs it).
func TestPTXFresh(t *testing.T) {
	if _, err := exec.LookPath("nvcc"); err != nil {
		t.Skip("nvcc not found: the committed PTX is not checked (make cuda-toolkit installs CUDA 11.8)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("./gen.sh", dir).CombinedOutput(); err != nil {
		t.Fatalf("gen.sh: %v\n%s", err, out)
	}
	for _, a := range Archs {
		name := filepath.Join("ptx", "inject_sm"+strconv.Itoa(a)+".ptx")
		want, err := os.ReadFile(filepath.Join(dir, filepath.Base(name)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make cuda` and commit it", name)
		}
		cubin := filepath.Join(dir, "sm"+strconv.Itoa(a)+".cubin")
		if out, err := exec.Command("ptxas", "-arch=sm_"+strconv.Itoa(a), "-o", cubin, name).CombinedOutput(); err != nil {
			t.Errorf("ptxas %s: %v\n%s", name, err, out)
		}
	}
}

// TestPTXNoFMA: the committed PTX has no fused float multiply-add and
// exports the kernel, for every architecture.
func TestPTXNoFMA(t *testing.T) {
	for _, a := range Archs {
		p, err := PTX(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []string{"fma.rn.f32", "fma.rn.f64", "mad.f32", "fma.rn.ftz"} {
			if strings.Contains(string(p), op) {
				t.Errorf("sm_%d PTX contains %s", a, op)
			}
		}
		if !strings.Contains(string(p), ".entry "+Kernel+"(") {
			t.Errorf("sm_%d PTX does not define %s", a, Kernel)
		}
	}
	if _, err := PTX(75); err == nil {
		t.Error("PTX(75) has no architecture to give, but did not fail")
	}
	if p, _ := PTX(100); !bytes.Contains(p, []byte(".target sm_90")) {
		t.Error("PTX(100) is not the sm_90 PTX")
	}
}
