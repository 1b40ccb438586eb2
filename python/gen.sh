#!/usr/bin/env bash
# Regenerates python/kvmesh/_pb/*_pb2*.py from api/*.proto with Debian's
# protoc (protobuf-compiler 3.21) and gRPC Python plugin
# (protobuf-compiler-grpc 1.51; python3-grpc-tools bundles a protoc too old
# for proto3 `optional`). The generated files are committed. protoc writes
# top-level imports ("import kvmesh_pb2"); they are made relative so the
# modules live inside the package. An argument writes them to another
# directory instead (python/tests/test_package.py compares).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-python/kvmesh/_pb}
if ! command -v protoc >/dev/null 2>&1 || [ ! -x /usr/bin/grpc_python_plugin ]; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler protobuf-compiler-grpc >/dev/null
fi
mkdir -p "$out"
rm -f "$out"/*_pb2.py "$out"/*_pb2_grpc.py
protoc --proto_path=api --python_out="$out" --grpc_python_out="$out" \
	--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin api/*.proto
for f in "$out"/*_pb2.py "$out"/*_pb2_grpc.py; do
	sed -i -E 's/^import ([a-z_]+_pb2) as /from . import \1 as /' "$f"
done
echo "python: regenerated $(ls "$out"/*_pb2*.py | wc -l) modules with $(protoc --version) and grpc_python_plugin $(dpkg-query -W -f='${Version}' protobuf-compiler-grpc 2>/dev/null)"
