package kern

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"testing"

	"github.com/kvmesh/kvmesh/cudakern"
)

// TestPTXJobLayout reads the kvm_job loads of the kernel as nvcc compiled
// it for each architecture: every load from the job pointer (the first
// kernel argument, directly or through a register it offsets) must read
// whole fields of cudakern.DeviceJob of the load's element size. So the
// device's view of the struct is the Go mirror's, not only the host
// compiler's (TestHostLayout), vector loads included.
func TestPTXJobLayout(t *testing.T) {
	type field struct {
		name string
		size int
	}
	fields := map[int]field{} // by offset
	typ := reflect.TypeFor[cudakern.DeviceJob]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		fields[int(f.Offset)] = field{f.Name, int(f.Type.Size())}
	}
	var (
		param = regexp.MustCompile(`ld\.param\.u64\s+(%rd\d+), \[kvm_inject_param_0\];`)
		cvta  = regexp.MustCompile(`cvta\.to\.global\.u64\s+(%rd\d+), (%rd\d+);`)
		add   = regexp.MustCompile(`add\.s64\s+(%rd\d+), (%rd\d+), (\d+);`)
		load  = regexp.MustCompile(`ld\.global(?:\.nc)?(?:\.v(\d))?\.([suf])(\d+)\s+[^\[]+\[(%rd\d+)(?:\+(\d+))?\];`)
	)
	for _, a := range Archs {
		name := fmt.Sprintf("ptx/inject_sm%d.ptx", a)
		src, err := ptxFiles.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		m := param.FindSubmatch(src)
		if m == nil {
			t.Fatalf("%s: no load of kvm_inject's first argument", name)
		}
		generic := string(m[1])
		base := map[string]int{} // registers holding the job's global address plus an offset
		for _, c := range cvta.FindAllSubmatch(src, -1) {
			if string(c[2]) == generic {
				base[string(c[1])] = 0
			}
		}
		if len(base) == 0 {
			t.Fatalf("%s: the job pointer is never converted to a global address", name)
		}
		for _, c := range add.FindAllSubmatch(src, -1) {
			if off, ok := base[string(c[2])]; ok {
				n, _ := strconv.Atoi(string(c[3]))
				base[string(c[1])] = off + n
			}
		}
		read := map[string]bool{}
		for _, l := range load.FindAllSubmatch(src, -1) {
			off, ok := base[string(l[4])]
			if !ok {
				continue
			}
			if len(l[5]) > 0 {
				n, _ := strconv.Atoi(string(l[5]))
				off += n
			}
			vec := 1
			if len(l[1]) > 0 {
				vec, _ = strconv.Atoi(string(l[1]))
			}
			bits, _ := strconv.Atoi(string(l[3]))
			size := bits / 8
			for k := range vec {
				f, ok := fields[off+k*size]
				if !ok || f.size != size {
					t.Errorf("%s: %q reads %d bytes at job offset %d: DeviceJob has %+v there", name, l[0], size, off+k*size, f)
					continue
				}
				read[f.name] = true
			}
		}
		// A parse that found nothing would pass vacuously: the kernel reads
		// nearly every field.
		if len(read) < len(fields)-4 {
			t.Errorf("%s: loads of only %d of DeviceJob's %d fields found: %v", name, len(read), len(fields), read)
		}
		t.Logf("%s: %d of %d fields read by the kernel", name, len(read), len(fields))
	}
}
