#!/usr/bin/env bash
# gpu-check.sh: the one prepared run of kvmesh's GPU code on a CUDA device
# (an H200 in the device tool), in well under 8 minutes:
#
#   1. cudakern/gpu's tests: the kernel (the embedded PTX of cudakern/kern)
#      equals the CPU Injector bit for bit on every dtype pair and order
#      (host-memory path), codec payloads decoded in the same pass from
#      device memory (InjectDevice, one event per layer), bad targets
#      refused, a cache exported by CUDA IPC injected from a second
#      process, and entries of the GPU tier (kvtier's slab) injected from
#      their device copies into a device cache (TestGPUTierInjectDevice;
#      TestGPUServiceDeviceToDevice: the node's whole path, an
#      inject.Service over the tier writing a second process's IPC cache).
#   2. kvtier's GPU tier tests on the real device: put/get/evict, budgets,
#      staging copies.
#   3. A benchmark table: rotate+scatter and fused dequant+rotate+scatter
#      GB/s against a device-to-device copy of the same bytes (target >=
#      0.8), and the tier's host-to-device staging GB/s.
#   4. kvmeshd built with the cuda tag: it starts with a GPU tier, injects
#      on the GPU (its log names the kernel) and shows the tier's budget.
#   5. Python with real CUDA: torch's IPC export of a tensor opened by a
#      second process (python/tests/test_cuda_ipc.py, cupy there); pinned
#      host staging (python/tests/test_cuda_staging.py)
#      with real CUDA tensors: the fallback of a GPU cache the node cannot
#      write by CUDA IPC, against kvmeshd built without the cuda tag (it
#      answers IPC Unimplemented); bytes equal a shared-memory cache's.
#      The vLLM connector (python/tests/test_vllm.py, driven by the test,
#      no vLLM) with vLLM-style CUDA layers: "auto" falls back the same
#      way and the loaded blocks equal the prefill's.
#      Needs the device's python3 with torch, grpcio, protobuf, numpy,
#      xxhash and pytest (its image has them); SKIP where one is missing.
#   6. The demo (cmd/kvmesh-demo, cuda build) with its injections on the
#      GPU (it prints the kernel), on the committed recall model.
#
# The device machine has the driver but no Go and no network: the payload
# is prebuilt here by `make gpu-payload` into the ignored folder
# out/gpu-check (test binaries with the PTX embedded and the demo, gzipped,
# and BUILT_AT; with the tree at most 64 MiB) and passed with carry:
# ["out/gpu-check"]:
#
#   make gpu-payload
#   device tool: command "bash scripts/device/gpu-check.sh", carry ["out/gpu-check"], timeout_s 540
#
# Results land in $OUT, six files (the device tool returns at most 8):
# gpu-check.log (everything), bench.txt, table.md (the lines for
# docs/BENCHMARKS.md, with the commit of BUILT_AT), kvmeshd.log,
# staging.txt and demo.txt. Scratch files go to a temporary folder.
set -uo pipefail

OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-check.log") 2>&1
C=$PWD/out/gpu-check
P=$(mktemp -d /tmp/gpu-check.XXXXXX)
trap 'rm -rf "$P"' EXIT
fail=0
step() { echo; echo "== $(date -u +%T) $*"; }
# The whole run keeps inside GPU_CHECK_SECONDS (default 470: the device
# tool's 8-minute try, with room for the transfers). Each step's timeout is
# its own cap or what is left, whichever is less; a step with under 20 s
# left is skipped and says so. Go test binaries get -test.timeout 10 s
# under their step's, so a hang prints every goroutine's stack.
end=$((SECONDS + ${GPU_CHECK_SECONDS:-470}))
budget() {
	local left=$((end - SECONDS - 5))
	if ((left < 20)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}
skipped() { echo "SKIP: $1: the run's time is spent"; fail=1; }

step "payload built at $(cat "$C/BUILT_AT" 2>/dev/null || echo '?') on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader || true
for z in "$C"/*.gz; do
	[[ -f $z ]] || { echo "no payload in $C: run make gpu-payload and carry out/gpu-check" >&2; exit 2; }
	b=$(basename "$z" .gz)
	gzip -dc "$z" >"$P/$b" && chmod +x "$P/$b" || { echo "cannot unpack $z" >&2; exit 2; }
done
for b in cudakern_gpu.test kvtier_cuda.test kvmesh-demo kvmeshd-cuda kvmeshd; do
	[[ -x $P/$b ]] || { echo "missing $b in the payload: run make gpu-payload and carry out/gpu-check" >&2; exit 2; }
done

# The binaries need the driver's libcuda.so.1 (and glibc >= 2.34); the
# driver's folder may be outside the loader's cache.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
	for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
		[[ -e $d/libcuda.so.1 ]] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	done
fi
ldd "$P/cudakern_gpu.test" | grep -E 'libcuda|not found' || echo "ldd found no libcuda.so.1 for the test binary"

step "cudakern/gpu tests"
T=$(budget 150)
((T > 0)) || skipped "cudakern/gpu tests"
((T > 0)) && { (cd cudakern/gpu && timeout $T "$P/cudakern_gpu.test" -test.run 'TestGPU|TestGPUTierInjectDevice|TestGPUServiceDeviceToDevice' -test.v -test.count=1 -test.timeout=$((T - 10))s) || fail=1; }

step "kvtier GPU tier tests"
T=$(budget 90)
((T > 0)) || skipped "kvtier GPU tier tests"
((T > 0)) && { (cd kvtier && timeout $T "$P/kvtier_cuda.test" -test.run 'TestGPUTier|TestConcurrentBudgets|TestCUDACopies' -test.v -test.count=1 -test.timeout=$((T - 10))s) || fail=1; }

step "benchmarks"
: >"$OUT/bench.txt"
T=$(budget 75)
((T > 0)) || skipped "cudakern/gpu benchmarks"
((T > 0)) && { (cd cudakern/gpu && timeout $T "$P/cudakern_gpu.test" -test.run '^$' -test.bench 'BenchmarkGPU' -test.benchtime=1s -test.count=3 -test.timeout=$((T - 10))s) | tee -a "$OUT/bench.txt" || fail=1; }
T=$(budget 45)
((T > 0)) || skipped "kvtier benchmarks"
((T > 0)) && { (cd kvtier && timeout $T "$P/kvtier_cuda.test" -test.run '^$' -test.bench 'BenchmarkCUDACopy' -test.benchtime=1s -test.count=2 -test.timeout=$((T - 10))s) | tee -a "$OUT/bench.txt" || fail=1; }
# GB/s of each benchmark's best run, and each inject over the copy.
{
	echo "| benchmark | GB/s | / device-to-device copy |"
	echo "|---|---|---|"
	awk '/^Benchmark/ { for (i = 2; i < NF; i++) if ($(i+1) == "MB/s") { n = $1; sub(/-[0-9]+$/, "", n); if ($i > best[n]) best[n] = $i } }
		END {
			copy = best["BenchmarkGPUCopy"]
			for (n in best) printf "| %s | %.1f | %s |\n", n, best[n] / 1000, (n ~ /GPUInject/ && copy > 0) ? sprintf("%.2f", best[n] / copy) : ""
		}' "$OUT/bench.txt" | sort
} | tee "$OUT/table.md"

step "kvmeshd (cuda build): a GPU tier of 1 GiB, injection on the GPU"
# The node must start, open the slab, say it injects on the GPU and show
# the tier's budget in its metrics; it is stopped with SIGTERM.
kd=$(mktemp -d /tmp/gpu-check-node.XXXXXX)
"$P/kvmeshd-cuda" -id g1 -data-dir "$kd" -insecure -bootstrap -gpu 1G \
	-grpc 127.0.0.1:0 -gossip 127.0.0.1:0 -raft 127.0.0.1:0 -http 127.0.0.1:0 >"$OUT/kvmeshd.log" 2>&1 &
kpid=$!
for _ in $(seq $((2 * $(budget 60)))); do grep -q '^kvmeshd ready' "$OUT/kvmeshd.log" && break; kill -0 $kpid 2>/dev/null || break; sleep 0.5; done
if grep -q '^kvmeshd ready' "$OUT/kvmeshd.log"; then
	http=$(sed -n 's/^kvmeshd ready.* http=\([^ ]*\).*/\1/p' "$OUT/kvmeshd.log" | head -1)
	exec 3<>"/dev/tcp/${http%:*}/${http##*:}" && printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3 && timeout 10 cat <&3 >"$P/kvmeshd-metrics.txt"
	exec 3<&-
	grep 'kvtier_budget_bytes{tier="gpu"}' "$P/kvmeshd-metrics.txt" || { echo "no GPU tier budget in the node's metrics"; fail=1; }
	grep -m1 'injection kernel' "$OUT/kvmeshd.log"
	grep -q 'injection kernel.*kernel="\?cuda' "$OUT/kvmeshd.log" || { echo "kvmeshd does not inject on the GPU"; fail=1; }
else
	echo "kvmeshd did not get ready:"; tail -20 "$OUT/kvmeshd.log"; fail=1
fi
kill -TERM $kpid 2>/dev/null; timeout 30 tail --pid=$kpid -f /dev/null; kill -KILL $kpid 2>/dev/null
rm -rf "$kd"

step "Python: pinned host staging and the vLLM connector with CUDA tensors"
# The tests with the "cuda" parameter run only where torch sees a GPU;
# the nodes are kvmeshd without the cuda tag, so "auto" must fall back.
if python3 -c 'import torch, grpc, google.protobuf, numpy, xxhash, pytest; assert torch.cuda.is_available()' 2>"$P/python-imports.txt"; then
	T=$(budget 150)
	((T > 0)) || skipped "Python tests"
	((T > 0)) && KVMESHD=$P/kvmeshd PYTHONUNBUFFERED=1 timeout $T python3 -m pytest -v -p no:cacheprovider \
		python/tests/test_cuda_ipc.py python/tests/test_cuda_staging.py python/tests/test_vllm.py 2>&1 | tee "$OUT/staging.txt" | tail -30
	[[ ${PIPESTATUS[0]} -eq 0 ]] || fail=1
	# torch's IPC export of a real tensor opens in another process (cupy).
	grep -q 'test_cuda_ipc.py::test_real_export_opens_in_another_process PASSED' "$OUT/staging.txt" ||
		{ echo "the IPC export of a real CUDA tensor did not open in another process"; fail=1; }
	# Every order and dtype, and the auto fallback, with CUDA tensors.
	n=$(grep -c 'test_cuda_staging.py::.*\[cuda.*PASSED' "$OUT/staging.txt")
	[[ $n -ge 9 ]] || { echo "$n CUDA staging tests passed, want 9"; fail=1; }
	# The connector over CUDA layers in both cache shapes.
	n=$(grep -c 'test_vllm.py::test_cuda_cache_loads\[cuda-.*PASSED' "$OUT/staging.txt")
	[[ $n -ge 2 ]] || { echo "$n CUDA vLLM connector tests passed, want 2"; fail=1; }
else
	echo "SKIP: python3 here lacks torch with CUDA or the client's packages:"; tail -3 "$P/python-imports.txt"
fi

step "demo, injections on the GPU"
T=$(budget 150)
((T > 0)) || skipped "the demo"
((T > 0)) && timeout $T "$P/kvmesh-demo" -model train/recall -facts 200 -k 5,20 -queries 4 -answer-prompts 2 -out "$P/demo" 2>&1 | tee "$OUT/demo.txt" | tail -40 || fail=1
grep -m1 'injection kernel' "$OUT/demo.txt" || { echo "the demo did not log its injection kernel"; fail=1; }
grep -q 'injection kernel: cuda' "$OUT/demo.txt" || { echo "the demo's injections did not run on the GPU"; fail=1; }

step "done, fail=$fail"
exit $fail
