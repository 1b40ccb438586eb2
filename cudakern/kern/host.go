//go:build cgo

package kern

/*
#cgo CFLAGS: -O2 -std=c99 -Wall -Werror
#include <stddef.h>
#include <stdlib.h>
#include "inject.h"

// The kernel's grid on one thread: block (tok, layer), lanes threads.
static kvm_u32 kvm_host_run(const kvm_job *j, int lanes) {
	kvm_u32 err = 0;
	for (int l = 0; l < j->layers; l++)
		for (kvm_i64 t = 0; t < j->tokens; t++)
			for (int lane = 0; lane < lanes; lane++)
				err |= kvm_token(j, l, t, lane, lanes);
	return err;
}

static const size_t kvm_job_offsets[] = {
	offsetof(kvm_job, src), offsetof(kvm_job, dst), offsetof(kvm_job, slots), offsetof(kvm_job, cs),
	offsetof(kvm_job, err), offsetof(kvm_job, num_blocks), offsetof(kvm_job, layers), offsetof(kvm_job, tokens),
	offsetof(kvm_job, src_heads), offsetof(kvm_job, head_lo), offsetof(kvm_job, heads), offsetof(kvm_job, head_dim),
	offsetof(kvm_job, half), offsetof(kvm_job, rotary), offsetof(kvm_job, neox), offsetof(kvm_job, src_dt),
	offsetof(kvm_job, dst_dt), offsetof(kvm_job, codec), offsetof(kvm_job, order), offsetof(kvm_job, block_size),
	offsetof(kvm_job, copy_v), offsetof(kvm_job, src_kscale), offsetof(kvm_job, src_vscale),
	offsetof(kvm_job, dst_kscale), offsetof(kvm_job, dst_vscale), offsetof(kvm_job, pad),
};
static size_t kvm_job_offset(int i) { return kvm_job_offsets[i]; }
static int kvm_job_fields(void) { return sizeof kvm_job_offsets / sizeof kvm_job_offsets[0]; }
*/
import "C"

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/kvmesh/kvmesh/cudakern"
)

// LayoutError reports whether cudakern.DeviceJob and inject.h's kvm_job
// disagree on a field's offset or the struct's size (then no job can be
// passed to a kernel as is).
func LayoutError() error {
	t := reflect.TypeFor[cudakern.DeviceJob]()
	if t.NumField() != int(C.kvm_job_fields()) {
		return fmt.Errorf("DeviceJob has %d fields, kvm_job %d", t.NumField(), C.kvm_job_fields())
	}
	for i := 0; i < t.NumField(); i++ {
		if got, want := t.Field(i).Offset, uintptr(C.kvm_job_offset(C.int(i))); got != want {
			return fmt.Errorf("DeviceJob.%s at %d, kvm_job's field %d at %d", t.Field(i).Name, got, i, want)
		}
	}
	if got, want := t.Size(), uintptr(C.sizeof_kvm_job); got != want {
		return fmt.Errorf("DeviceJob is %d bytes, kvm_job %d", got, want)
	}
	return nil
}

// Run executes dj on the CPU through inject.h, as the kernel's grid would
// with lanes threads per block, and returns the error bits. src holds the
// source layers (raw or codec payloads), dst the cache layers it writes in
// place; slots and cs are the job's slots and cos/sin rows (Job.CosSin).
// The addresses in dj are ignored: Run copies everything into C memory.
func Run(dj cudakern.DeviceJob, src, dst [][]byte, slots []int, cs []float32, lanes int) uint32 {
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	alloc := func(n int) unsafe.Pointer {
		p := C.malloc(C.size_t(max(n, 1)))
		frees = append(frees, p)
		return p
	}
	addrs := func(layers [][]byte) (uint64, []unsafe.Pointer) {
		a := (*[1 << 20]uint64)(alloc(8 * len(layers)))[:len(layers):len(layers)]
		ps := make([]unsafe.Pointer, len(layers))
		for i, l := range layers {
			ps[i] = alloc(len(l))
			copy(unsafe.Slice((*byte)(ps[i]), len(l)), l)
			a[i] = uint64(uintptr(ps[i]))
		}
		return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(a)))), ps
	}
	dj.Src, _ = addrs(src)
	var outs []unsafe.Pointer
	dj.Dst, outs = addrs(dst)
	s := (*[1 << 30]int64)(alloc(8 * len(slots)))[:len(slots):len(slots)]
	for i, v := range slots {
		s[i] = int64(v)
	}
	dj.Slots = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s))))
	c := (*[1 << 30]float32)(alloc(4 * len(cs)))[:len(cs):len(cs)]
	copy(c, cs)
	dj.CS = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(c))))
	dj.Err = uint64(uintptr(alloc(4)))
	errBits := C.kvm_host_run((*C.kvm_job)(unsafe.Pointer(&dj)), C.int(lanes))
	for i, p := range outs {
		copy(dst[i], unsafe.Slice((*byte)(p), len(dst[i])))
	}
	return uint32(errBits)
}
