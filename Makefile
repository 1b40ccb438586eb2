# kvmesh build and test entry points. `make test` is what CI runs (.ci/run);
# `make test-short` is the fast loop while editing; `make help` lists the main targets.
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -buildvcs=false
BIN := bin

# The commit `kvmesh version` and `kvmeshd version` print: -buildvcs=false
# leaves out Go's own stamp, so it goes in through the linker
# (internal/buildinfo); "unknown" outside a git checkout.
COMMIT := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
MODIFIED := $(shell test -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" && echo true)
LDFLAGS := -X github.com/kvmesh/kvmesh/internal/buildinfo.commit=$(COMMIT) -X github.com/kvmesh/kvmesh/internal/buildinfo.modified=$(MODIFIED)

##@ Build and run
.PHONY: all build build-cuda run clean help

all: build

build: ## static binaries of ./cmd/... into bin/ (CGO_ENABLED=0)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# A kvmeshd for GPU machines: the GPU tier, injection on the GPU, CUDA IPC
# caches. It links CUDA's driver library and exits at start where no
# driver answers, so it is a binary of its own.
build-cuda: cuda-toolkit ## bin/kvmeshd-cuda, kvmeshd with the GPU code (-tags cuda, cgo; installs the toolkit)
	CGO_ENABLED=1 $(GO) build -tags cuda -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/kvmeshd-cuda ./cmd/kvmeshd

# The main job: a local cluster doing real work (see README).
run: ## the main job: the in-process demo, a local cluster doing real work
	$(GO) run ./cmd/kvmesh-demo

clean: ## remove bin/
	rm -rf $(BIN)

# The main targets, one line each: the "## " text after a rule's prerequisites.
help: ## this list
	@awk -F ':[^#]*## ' '/^##@ /{printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_.-]+:[^#]*## /{printf "  %-24s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Test
.PHONY: test test-short fmt-check vet unit fuzz fuzz-all fuzz-run check-rules cuda-check test-python

# Packages whose tests are pure compute and far slower under the race
# detector; they still get -race on their concurrent parts through the
# packages that drive them.
NORACE_RE := /engine$$
PKGS = $(shell $(GO) list ./...)
RACE_PKGS = $(filter-out $(shell $(GO) list ./... | grep -E '$(NORACE_RE)'),$(PKGS))
NORACE_PKGS = $(shell $(GO) list ./... | grep -E '$(NORACE_RE)')

test: tools fmt-check vet cuda-check check-rules unit fuzz test-python ## every test, what CI runs: gofmt, vet, CUDA checks, alert rules, -race, fuzz, Python

# The fast loop while changing code: unit tests with -short, no race
# detector; process, chaos and whole-cluster tests skip themselves
# (testutil.SkipIfShort). `make test` runs everything before a change lands.
test-short: ## the fast loop while editing: unit tests with -short, no race detector
	$(GO) test -short -timeout 5m ./...

fmt-check: ## gofmt of every tracked Go file
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet: ## go vet, and the CGO_ENABLED=0 build
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...

# 15m: tests/chaos runs two multi-minute scenarios (TestChaos, and
# TestRestartChaos at 3 x 300 MB) in one test binary.
unit: ## go test -race of every package (the engine without -race)
	$(GO) test -race -timeout 15m $(RACE_PKGS)
	$(if $(strip $(NORACE_PKGS)),$(GO) test -timeout 10m $(NORACE_PKGS))

# Every fuzz target's seed corpus runs as a unit test. `make test` also fuzzes
# the decoders of untrusted input briefly ("package:FuzzName"); `make
# fuzz-all` fuzzes every target.
FUZZ_TARGETS := ./chunk:FuzzDecode ./api:FuzzFrameUnmarshal ./engine:FuzzParseSafetensors \
	./meta:FuzzDecodeCommand ./kvtier:FuzzDiskRead ./inject:FuzzDescriptorMemory \
	./auth:FuzzAuthorizationHeader ./node:FuzzClientService ./node:FuzzPeerService \
	./node:FuzzInjectorService ./node:FuzzAdminService ./daemon:FuzzDaemonConfig \
	./kvtier:FuzzExtentAllocator ./client:FuzzInjectResults ./node:FuzzPutKey ./respserver:FuzzReader \
	./meta:FuzzOpenEntry ./api:FuzzRecvCacheFile
FUZZ_TARGETS += ./api:FuzzCapLists
FUZZ_ALL = $(shell grep -rl --include='*_test.go' '^func Fuzz' . | while read f; do \
	d=$$(dirname $$f); grep -ho '^func Fuzz[A-Za-z0-9_]*' $$f | sed "s|func |$$d:|"; done)
FUZZTIME ?= 8s

fuzz: ## the decoders of untrusted input fuzzed briefly (FUZZTIME each)
	@$(MAKE) --no-print-directory fuzz-run TARGETS="$(FUZZ_TARGETS)"

fuzz-all: ## every fuzz target, 60s each
	@$(MAKE) --no-print-directory fuzz-run TARGETS="$(FUZZ_ALL)" FUZZTIME=60s

# A duration -fuzztime can fail a target with a bare "context deadline
# exceeded" and no crasher when the time runs out (a race in Go's fuzzing
# coordinator, golang/go#75804, fixed in Go 1.27; more likely on a loaded
# machine): that exact signature is retried, up to 3 tries; anything else,
# and any run that wrote a failing input, fails at once.
fuzz-run:
	@set -e; for t in $(TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		for try in 1 2 3; do \
			echo "fuzz $$pkg $$name ($(FUZZTIME), try $$try)"; \
			if out=$$($(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg 2>&1); then \
				echo "$$out" | tail -1; break; fi; \
			echo "$$out"; \
			if [ $$try = 3 ] || echo "$$out" | grep -q 'Failing input written to' || \
				! echo "$$out" | grep -qx '[[:space:]]*context deadline exceeded'; then exit 1; fi; \
			echo "fuzz $$name: no failing input, the coordinator's deadline race (golang/go#75804); trying again"; \
		done; \
	done

# The Prometheus alert rules: syntax, and alerts firing on test series.
PROM_RULES := deploy/prometheus/kvmesh-rules.yml

check-rules: ## promtool check and test of the Prometheus alert rules
	@if command -v promtool >/dev/null 2>&1; then \
		promtool check rules $(PROM_RULES) && promtool test rules $(PROM_RULES:.yml=_test.yml); \
	else echo "warning: promtool missing (make tools installs it); $(PROM_RULES) not checked"; fi

CUDA_TAGGED = $(shell grep -rl --include='*.go' '^//go:build.*\bcuda\b' . | xargs -r -n1 dirname | sort -u)

# What `make test` adds with the toolkit: the cuda-tagged build, vet of
# every package with cuda-tagged files, the PTX checks and the host checks.
cuda-check: cuda-toolkit ## the cuda-tagged build and vet, the PTX and host checks (installs the toolkit)
	CGO_ENABLED=1 $(GO) build -tags cuda ./...
	CGO_ENABLED=1 $(GO) vet -tags cuda $(CUDA_TAGGED)
	CGO_ENABLED=1 $(GO) test -count=1 -run 'TestPTX|TestHost' ./cudakern/kern

# The Python package (python/) runs on Debian's python3 and packages, not on
# whatever python3 comes first on PATH (a pyenv one lacks them).
PYTHON := /usr/bin/python3
PY_DEBS := python3-grpcio python3-protobuf python3-numpy python3-xxhash python3-pytest python3-torch python3-redis \
	libopenblas0-pthread protobuf-compiler protobuf-compiler-grpc

# The Python suite, against kvmeshd processes it starts (bin/kvmeshd).
test-python: python-deps build ## the Python suite against kvmeshd processes
	timeout 600 $(PYTHON) -m pytest -q -p no:cacheprovider python/tests

##@ Benchmarks
.PHONY: bench bench-engine bench-workloads bench-workloads-quick bench-steady soak bench-rebalance bench-redis bench-resp bench-linkrate bench-accuracy bench-accuracy-facts50 bench-serving train-recall

bench: ## Go benchmarks of every package (docs/BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

# TTFT of prompt injection vs KV injection on the reference engine (~3 min).
bench-engine: ## TTFT of prompt injection vs KV injection on the reference engine
	$(GO) run ./cmd/kvmesh-engine-bench -trials 7 -prompts 4

# Workload benchmarks (RAG, multi-turn chat, memory facts) against a local
# cluster; writes docs/bench/WORKLOADS.md and its plots (~7 min on 2 cores).
bench-workloads: ## RAG, chat and memory-fact workloads (docs/bench/WORKLOADS.md)
	$(GO) run ./cmd/kvmesh-bench -out docs/bench

bench-workloads-quick: ## the workload benchmarks, quick
	$(GO) run ./cmd/kvmesh-bench -quick -out docs/bench

# Steady-state RAG under a bounded store (docs/bench/STEADY.md): two query
# nodes, 2000 + 1000 novel-order queries over a 1000-passage Zipf corpus, a
# 3-node cluster whose DRAM holds twice the corpus, once per write-back
# policy (none, admit all, admit by reuse). About 30 minutes on 2 busy cores.
bench-steady: ## steady-state RAG under a bounded store (docs/bench/STEADY.md)
	$(GO) run ./cmd/kvmesh-bench -steady -timeout 90m -out docs/bench

# The restart chaos scenario (tests/chaos/restart_test.go) at soak size: 5
# DRAM-only nodes holding 500 MB each under read and write load, a rolling
# restart, back-to-back kill -9s and three two-node failures, all paced only
# by readiness; lost and wrong must be 0. The report goes to out/soak.txt
# (and docs/BENCHMARKS.md by hand). `make test` runs it at 3 x 300 MB with
# kvmeshd's default disk tier.
soak: ## the restart chaos scenario at 5 x 500 MB (out/soak.txt)
	mkdir -p out
	KVMESH_RESTART_NODES=5 KVMESH_RESTART_MB=500 KVMESH_RESTART_PAIRS=3 KVMESH_RESTART_DISK=0 KVMESH_RESTART_REPORT=$(CURDIR)/out/soak.txt \
		$(GO) test -run '^TestRestartChaos$$' -count 1 -v -timeout 60m ./tests/chaos

# Rebalance of a 3-node cluster holding 10 GiB (R=1, real kvmeshd processes)
# when a 4th joins: time, bytes moved against a quarter, Get latency, RSS.
bench-rebalance: ## a 4th node joins 3 kvmeshd holding 10 GiB
	KVMESH_REBALANCE_BYTES=10G $(GO) test -run '^$$' -bench Rebalance10G -benchtime 1x -timeout 60m -v ./tests/cluster

# Put and Get of the same entries (256 KiB, 1 MiB, 4 MiB; raw and lossless)
# on 3 kvmeshd processes (R=3 W=2, then R=1 W=1) against redis-server (a
# primary with 2 replicas and WAIT 1, then one server), 8 clients; one
# table with the ratios (~3 minutes). BENCH_REDIS_FLAGS adds flags, e.g.
# -putget-profile DIR for the nodes' pprof profiles of every point.
bench-redis: redis-tools build ## Put and Get on kvmeshd against redis-server
	$(BIN)/kvmesh-bench -putget -kvmeshd $(BIN)/kvmeshd $(BENCH_REDIS_FLAGS)

# redis-benchmark (-t set,get -P 16 -c 8) against kvmesh's Redis-protocol
# door (one node, and three with R = 3, W = 2) and against redis-server,
# same value sizes (BENCH_RESP_SIZES, bytes; BENCH_RESP_FLAGS adds
# redis-benchmark flags, e.g. -r 100000); prints the table of
# docs/BENCHMARKS.md.
BENCH_RESP_SIZES ?= 4096 65536 1048576

bench-resp: redis-tools build ## redis-benchmark against kvmeshd's Redis door and redis-server
	KVMESHD=$(BIN)/kvmeshd scripts/bench-resp.sh "$(BENCH_RESP_SIZES)" "$(BENCH_RESP_FLAGS)"

# Remote-hit TTFT at k=50 for each codec at emulated 1, 10 and 25 Gbit/s
# peer links (kvmeshd -peer-link-rate) and unpaced, on 3 kvmeshd processes.
bench-linkrate: build ## remote-hit TTFT per codec at emulated link rates
	$(BIN)/kvmesh-bench -linkrate -kvmeshd $(BIN)/kvmeshd $(BENCH_LINKRATE_FLAGS)

ACCURACY_PROMPTS ?= 0
ACCURACY_BUDGET ?= 10m

# Answer accuracy of the trained recall model (train/recall) served each way
# through a local cluster, every prompt of its eval.json (ACCURACY_PROMPTS=0;
# 40 per task and k) taken round-robin over the cells until ACCURACY_BUDGET
# has passed; then the engine's prefill speed beside PyTorch's
# (/usr/bin/python3 train/reference.py) at 1 and 2 threads. Writes
# docs/bench/ACCURACY.md and its plots (about 12 minutes).
bench-accuracy: ## answer accuracy of the recall model each way (docs/bench/ACCURACY.md)
	$(GO) run ./cmd/kvmesh-bench -accuracy train/recall -accuracy-prompts $(ACCURACY_PROMPTS) -accuracy-budget $(ACCURACY_BUDGET) -timeout 60m -out docs/bench

# The facts k=50 target (APPROXIMATE with r=15% within 1 point of full
# prefill) needs a few hundred prompts to decide: 400 held-out facts
# prompts at k=50 of their own seed, every way, in docs/bench/facts50.
bench-accuracy-facts50: ## the facts k=50 accuracy target, 400 prompts (docs/bench/facts50)
	mkdir -p out
	/usr/bin/python3 train/gen.py --seed 5678 --n 400 --tasks facts --ks 50 --out out/eval-facts50.json
	$(GO) run ./cmd/kvmesh-bench -accuracy train/recall -accuracy-eval out/eval-facts50.json -accuracy-budget 30m -accuracy-baseline-rounds 1 -accuracy-threads 1 -timeout 60m -out docs/bench/facts50

# Concurrent serving through a 3-node cluster (engine.Scheduler): closed-loop
# users and open-loop Poisson arrivals, each way, and TTFT against k at a
# realistic shape; docs/bench/SERVING.md quotes its output.
bench-serving: ## concurrent serving through a 3-node cluster (docs/bench/SERVING.md)
	mkdir -p out
	$(GO) run ./cmd/kvmesh-demo -sections serving,shape -serve-users 1,10,25,50,100 -serve-k 10,50 \
		-serve-rates 5,10,20,40,80 -serve-duration 2s -serve-warm 500ms \
		-shape-k 5,10,20,50 -shape-prompt-k 5,50 -shape-queries 3 -cpuprofile out/serving.prof -out docs/bench | tee out/serving.txt

TRAIN_FLAGS ?= --seed 11 --head-dim 64 --heads 4 --kv-heads 2 --budget 2048 --nq 12 --ramp 0.4 --att-weight 1 --att-layer 3 --steps 1000000 --eval-every 1000000 --eval-n 12

# Retrains the recall model in its four phases (129 minutes on one core;
# Debian's python3-torch, python3-numpy and libopenblas0-pthread), then
# writes its evaluation set and PyTorch reference outputs.
TRAIN = OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 train/train.py --out out/recall-run $(TRAIN_FLAGS)

train-recall: ## retrain the recall model (about two hours)
	rm -rf out/recall-run
	$(TRAIN) --minutes 40 --stop-minutes 24 --eval-minutes 4 --lr 3e-3
	$(TRAIN) --minutes 30 --eval-minutes 5 --lr 1.6e-3 --resume --min-k 50
	$(TRAIN) --minutes 45 --eval-minutes 5 --lr 8e-4 --resume --min-k 50 --task-p 0.2,0.65,0.15
	$(TRAIN) --minutes 30 --eval-minutes 5 --lr 5e-4 --resume --min-k 50 --task-p 0.15,0.75,0.1
	mkdir -p train/recall && cp out/recall-run/model/* out/recall-run/curve.jsonl train/recall/
	/usr/bin/python3 train/gen.py --seed 1234 --n 40 --out train/recall/eval.json
	OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 train/reference.py --model train/recall --eval train/recall/eval.json --out train/recall/reference.json --threads 2

##@ Generated code and docs
.PHONY: proto proto-python docs cuda gpu-payload

# Regenerates the committed protobuf code (installs protoc and pinned plugins),
# Go's and the Python package's.
proto: proto-python ## regenerate the committed protobuf code, Go and Python
	./api/gen.sh

proto-python: ## regenerate the Python package's protobuf code
	./python/gen.sh

# The metrics reference, docs/METRICS.md, from a node's registry (node's
# TestMetricsDoc fails when they disagree).
docs: ## regenerate docs/METRICS.md from a node's registry
	$(GO) test -count=1 -run '^TestMetricsDoc$$' ./node -update

# The committed PTX (cudakern/kern/ptx), one file per architecture.
cuda: cuda-toolkit ## regenerate the committed PTX (installs the toolkit)
	$(GO) generate ./cudakern/kern

# The payload of scripts/device/gpu-check.sh, the one prepared GPU run:
# the cuda-tagged test binaries (the PTX embedded) and demo, gzipped, in the
# ignored out/gpu-check. It travels with the tracked tree, and the two
# together must fit the device tool's 64 MiB.
GPU_PAYLOAD := out/gpu-check

gpu-payload: cuda-toolkit ## the cuda-tagged test binaries and demo for the prepared GPU run
	rm -rf $(GPU_PAYLOAD) && mkdir -p $(GPU_PAYLOAD)
	CGO_ENABLED=1 $(GO) test -tags cuda -c -ldflags=-s -o $(GPU_PAYLOAD)/cudakern_gpu.test ./cudakern/gpu
	CGO_ENABLED=1 $(GO) test -tags cuda -c -ldflags=-s -o $(GPU_PAYLOAD)/kvtier_cuda.test ./kvtier
	CGO_ENABLED=1 $(GO) build -tags cuda -trimpath -ldflags "-s $(LDFLAGS)" -o $(GPU_PAYLOAD)/kvmesh-demo ./cmd/kvmesh-demo
	CGO_ENABLED=1 $(GO) build -tags cuda -trimpath -ldflags "-s $(LDFLAGS)" -o $(GPU_PAYLOAD)/kvmeshd-cuda ./cmd/kvmeshd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s $(LDFLAGS)" -o $(GPU_PAYLOAD)/kvmeshd ./cmd/kvmeshd
	gzip -9 $(GPU_PAYLOAD)/*.test $(GPU_PAYLOAD)/kvmesh-demo $(GPU_PAYLOAD)/kvmeshd-cuda $(GPU_PAYLOAD)/kvmeshd
	git rev-parse HEAD >$(GPU_PAYLOAD)/BUILT_AT
	@n=$$(du -cb $(GPU_PAYLOAD) | tail -1 | cut -f1); t=$$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1); \
		echo "$(GPU_PAYLOAD): $$n bytes, with the tracked tree $$((n + t))"; \
		[ $$((n + t)) -le 67108864 ] || { echo "over the device tool's 64 MiB"; exit 1; }

##@ Installing what the tests need (Debian packages)
.PHONY: tools redis-tools python-deps cuda-toolkit

# What the tests need from Debian: iptables for the chaos suite's partitions
# (without it, or without root, those scenarios SKIP and say why); promtool
# (package prometheus) for check-rules.
tools: ## install what the tests need from Debian (iptables, promtool, redis-tools)
	@command -v iptables >/dev/null 2>&1 || { \
		echo "installing iptables from Debian"; \
		(DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null) || \
		echo "warning: iptables could not be installed; partition scenarios will SKIP"; }
	@command -v promtool >/dev/null 2>&1 || { \
		echo "installing prometheus (promtool) from Debian"; \
		(DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) || \
		echo "warning: prometheus could not be installed; check-rules will SKIP"; }
	@{ command -v redis-cli && command -v redis-benchmark; } >/dev/null 2>&1 || { \
		echo "installing redis-tools (redis-cli, redis-benchmark) from Debian"; \
		(DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-tools >/dev/null) || \
		echo "warning: redis-tools could not be installed; the Redis-protocol door's client tests will SKIP"; }

# redis-server from Debian, the reference of `make bench-redis`.
redis-tools: ## install redis-server from Debian
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server from Debian"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

python-deps: ## install the Python suite's Debian packages
	@{ $(PYTHON) -c 'import grpc, google.protobuf, numpy, xxhash, pytest, torch, redis' && \
		command -v protoc && command -v grpc_python_plugin; } >/dev/null 2>&1 || { \
		echo "installing the Python suite's Debian packages"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PY_DEBS) >/dev/null; }

# CUDA. The kernels (cudakern/kern: inject.cu around the __host__
# __device__ arithmetic of inject.h) compile to PTX that is committed, like
# the protobuf code; TestPTXFresh fails when it is stale. The host checks
# run inject.h on the CPU against cudakern's Go kernels bit for bit
# (TestHost*, with cgo only). Debian ships CUDA 11.8 in contrib and
# non-free (the driver library it needs is in both): cuda-toolkit adds
# those components in a sources file of its own, derived from the
# machine's Debian sources, so it names no host they do not.
NVCC ?= nvcc
CUDA_SOURCES := /etc/apt/sources.list.d/kvmesh-cuda.sources

cuda-toolkit: ## install nvidia-cuda-toolkit from Debian contrib and non-free
	@command -v $(NVCC) >/dev/null 2>&1 || { \
		echo "installing nvidia-cuda-toolkit from Debian contrib and non-free"; \
		set -e; \
		if [ -f /etc/apt/sources.list.d/debian.sources ]; then \
			sed 's/^Components:.*$$/Components: contrib non-free/' /etc/apt/sources.list.d/debian.sources >$(CUDA_SOURCES); \
		else \
			grep -h '^deb .* main' /etc/apt/sources.list | sed 's/ main.*$$/ contrib non-free/' >$(CUDA_SOURCES:.sources=.list); \
		fi; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit >/dev/null; }
