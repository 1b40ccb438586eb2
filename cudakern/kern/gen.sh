#!/bin/sh
# Compiles inject.cu to the committed PTX, one file per architecture, into
# the folder $1 (default ptx): `make cuda` (go generate ./cudakern/kern)
# writes ptx/, and TestPTXFresh compiles into a temp folder and compares.
# -fmad=false: no multiply contracts into a fused multiply-add; with
# -ftz=false and IEEE division the device rounds as the CPU does.
set -eu
cd "$(dirname "$0")"
out=${1:-ptx}
NVCC=${NVCC:-nvcc}
mkdir -p "$out"
for sm in 80 90; do
	"$NVCC" -ptx -arch=compute_$sm -std=c++14 -fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
		-o "$out/inject_sm$sm.ptx" inject.cu
done
