package kern

import (
	"embed"
	"fmt"
)

//go:generate ./gen.sh

//go:embed ptx/*.ptx
var ptxFiles embed.FS

// Archs are the compute capabilities PTX is committed for: sm_80 (A100)
// and sm_90 (H100, H200). A newer device JIT-compiles the sm_90 PTX.
var Archs = []int{80, 90}

// Kernel is the entry point's name in the PTX.
const Kernel = "kvm_inject"

// PTX returns the PTX for compute capability major*10+minor: the newest
// committed architecture not above it.
func PTX(cc int) ([]byte, error) {
	best := 0
	for _, a := range Archs {
		if a <= cc && a > best {
			best = a
		}
	}
	if best == 0 {
		return nil, fmt.Errorf("kern: no PTX for compute capability %d.%d (need >= %d.%d)", cc/10, cc%10, Archs[0]/10, Archs[0]%10)
	}
	return ptxFiles.ReadFile(fmt.Sprintf("ptx/inject_sm%d.ptx", best))
}
