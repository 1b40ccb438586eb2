#!/usr/bin/env bash
# gpu-check.sh: run kvtier's GPU tier tests against a real CUDA device (the
# `cuda` build tag: kvtier/cuda.go over gorgonia.org/cu), on the device
# machine, which has the driver, nvcc and CUDA headers but no Go and no
# network. Results land in $OUT (gpu-check.log, bench.txt).
#
# It takes either of two payloads, prepared on the development machine in
# the ignored folder out/gpu-check/ and passed with carry: ["out/gpu-check"]
# (the carry limit is 64 MiB in all, which rules out a whole Go toolchain).
#
# A. A prebuilt test binary (about 12 MiB; preferred: nothing to build there).
#    CUDA headers and libcuda.so are needed only to compile and link; Debian
#    ships them in non-free, and nothing has to be installed:
#
#      mkdir -p /tmp/nf/lists/partial /tmp/nf/cache/archives/partial /tmp/nf/x
#      echo 'deb http://deb.debian.org/debian bookworm main contrib non-free' >/tmp/nf/sources.list
#      A="-o Dir::Etc::SourceList=/tmp/nf/sources.list -o Dir::Etc::SourceParts=/dev/null \
#         -o Dir::State::Lists=/tmp/nf/lists -o Dir::Cache=/tmp/nf/cache"
#      apt-get $A update && (cd /tmp/nf/cache/archives && apt-get $A download nvidia-cuda-dev)
#      dpkg-deb --fsys-tarfile /tmp/nf/cache/archives/nvidia-cuda-dev_*.deb |
#        tar -x -C /tmp/nf/x ./usr/include/cuda.h ./usr/lib/x86_64-linux-gnu/stubs/libcuda.so
#      mkdir -p out/gpu-check
#      CGO_CFLAGS=-I/tmp/nf/x/usr/include \
#      CGO_LDFLAGS=-L/tmp/nf/x/usr/lib/x86_64-linux-gnu/stubs \
#        go test -tags cuda -c -o out/gpu-check/kvtier_cuda.test ./kvtier
#      git rev-parse HEAD >out/gpu-check/BUILT_AT   # printed by the script
#
#    The binary links libcuda.so.1 (the driver's, there) and glibc >= 2.34.
#
# B. A Go toolchain and the module sources (about 45 MiB compressed), for
#    when the binary will not run there (another glibc) or code must change:
#
#      mkdir -p out/gpu-check
#      tar -C "$(go env GOROOT)/.." -cf - --exclude='*_test.go' --exclude=testdata \
#          --exclude=go/test --exclude=go/doc --exclude=go/api --exclude=go/misc \
#          --exclude=go/pkg/obj go | xz -T0 -6 >out/gpu-check/go.tar.xz
#      go mod vendor -o /tmp/gpu-vendor && tar -C /tmp -cf - gpu-vendor | xz -T0 -6 >out/gpu-check/vendor.tar.xz
#
#    The script unpacks both under /tmp and builds with -mod=vendor against
#    the CUDA headers of the machine (CUDA_HOME, default /usr/local/cuda).
#
# Run it (device tool):  command: "bash scripts/device/gpu-check.sh",
# carry: ["out/gpu-check"], timeout_s: 300. It needs about two minutes.
set -euo pipefail

OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
exec > >(tee "$LOG") 2>&1

PAYLOAD=out/gpu-check
TESTS='TestGPUTier|TestConcurrentBudgets|TestCUDACopies'
echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

run_binary() {
	local bin=$1
	echo "== tests"
	"$bin" -test.run "$TESTS" -test.v -test.count=1 -test.timeout=240s
	echo "== benchmarks"
	"$bin" -test.run '^$' -test.bench 'BenchmarkCUDACopy' -test.benchtime=2s -test.count=3 | tee "$OUT/bench.txt"
}

if [[ -x $PAYLOAD/kvtier_cuda.test ]]; then
	echo "== payload A: prebuilt test binary, built at $(cat $PAYLOAD/BUILT_AT 2>/dev/null || echo '?')"
	# gorgonia.org/cu's init exits the process when no driver or GPU answers.
	if probe=$("$PAYLOAD/kvtier_cuda.test" -test.list 'TestCUDACopies' 2>&1); then
		# Tests read and write temp dirs only; run from the package dir anyway
		# so that relative testdata paths resolve.
		cd kvtier
		run_binary "../$PAYLOAD/kvtier_cuda.test"
		exit 0
	fi
	echo "prebuilt binary does not start here: $probe"
	echo "trying payload B"
fi

if [[ -f $PAYLOAD/go.tar.xz && -f $PAYLOAD/vendor.tar.xz ]]; then
	echo "== payload B: toolchain and vendored modules"
	tar -C /tmp -xJf "$PAYLOAD/go.tar.xz"
	tar -C /tmp -xJf "$PAYLOAD/vendor.tar.xz"
	rm -rf vendor && mv /tmp/gpu-vendor vendor
	export PATH=/tmp/go/bin:$PATH GOROOT=/tmp/go GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off
	export GOCACHE=/tmp/gocache CGO_ENABLED=1
	CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
	export CGO_CFLAGS="-I$CUDA_HOME/include"
	export CGO_LDFLAGS="-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs"
	go version
	go vet -tags cuda ./kvtier/
	go test -tags cuda -c -o /tmp/kvtier_cuda.test ./kvtier
	cd kvtier
	run_binary /tmp/kvtier_cuda.test
	exit 0
fi

echo "no payload under $PAYLOAD: see this script's header" >&2
exit 2
