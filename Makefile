# kvmesh build and test entry points. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -buildvcs=false

BIN := bin
# Packages whose tests are pure compute and far slower under the race
# detector; they still get -race on their concurrent parts through the
# packages that drive them.
NORACE_RE := /engine$$
PKGS = $(shell $(GO) list ./...)
RACE_PKGS = $(filter-out $(shell $(GO) list ./... | grep -E '$(NORACE_RE)'),$(PKGS))
NORACE_PKGS = $(shell $(GO) list ./... | grep -E '$(NORACE_RE)')

# Fuzz targets run briefly in every `make test`: "package:FuzzName".
FUZZ_TARGETS := ./chunk:FuzzDecode
FUZZTIME ?= 10s

.PHONY: all build test vet fmt-check unit fuzz bench run proto tools clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...

unit:
	$(GO) test -race -timeout 10m $(RACE_PKGS)
	$(if $(strip $(NORACE_PKGS)),$(GO) test -timeout 10m $(NORACE_PKGS))

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

test: fmt-check vet unit fuzz

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

# The main job: a local cluster doing real work (see README).
run:
	$(GO) run ./cmd/kvmesh demo

# Regenerates the committed protobuf code (installs protoc and pinned plugins).
proto:
	./api/gen.sh

clean:
	rm -rf $(BIN)
