#!/usr/bin/env bash
# Regenerates api/*.pb.go from every api/*.proto with pinned tools:
# protoc from Debian, protoc-gen-go and protoc-gen-go-grpc installed into
# .gotools/ at the repository root. The generated files are committed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.5.1

if ! command -v protoc >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ]; then
		apt-get update -qq && apt-get install -y -qq protobuf-compiler
	else
		sudo apt-get update -qq && sudo apt-get install -y -qq protobuf-compiler
	fi
fi

export GOBIN="$root/.gotools"
mkdir -p "$GOBIN"
GOFLAGS=-mod=mod go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
GOFLAGS=-mod=mod go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
export PATH="$GOBIN:$PATH"

protoc --proto_path=api \
	--go_out=api --go_opt=paths=source_relative \
	--go-grpc_out=api --go-grpc_opt=paths=source_relative \
	api/*.proto
echo "api: regenerated with $(protoc --version), protoc-gen-go ${PROTOC_GEN_GO_VERSION}, protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION}"
