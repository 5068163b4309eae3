#!/usr/bin/env bash
# Regenerate the Python code of the Open Inference Protocol v2 gRPC service from its vendored
# .proto: the messages (*_pb2.py), the service stubs (*_pb2_grpc.py) and their type stubs
# (*.pyi, from mypy-protobuf). The generated files are committed; tests/test_grpc.py checks that
# they match the .proto.
#
# Usage: hack/gen-grpc.sh [OUT_ROOT]
#   OUT_ROOT defaults to runtime/ (the files land next to the .proto); the test passes a
#   temporary folder. PYTHON (default .venv/bin/python) must have grpcio-tools and
#   mypy-protobuf installed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
out="${1:-$repo/runtime}"
proto="batchpilot/runtime/grpc_api/grpc_predict_v2.proto"
bin="$(dirname "$python")"

mkdir -p "$out"
# The proto's path below runtime/ is its import path, so the generated service module imports
# the messages as batchpilot.runtime.grpc_api.grpc_predict_v2_pb2.
"$python" -m grpc_tools.protoc \
    --proto_path="$repo/runtime" \
    --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" \
    --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
    --python_out="$out" \
    --grpc_python_out="$out" \
    --mypy_out="$out" \
    --mypy_grpc_out="$out" \
    "$repo/runtime/$proto"

# The messages go into a descriptor pool of their own, not protobuf's default pool: Triton's
# client (tritonclient.grpc) registers the same `inference.*` names there, and a process that
# imports both (a test, a benchmark, an application that embeds the runtime) would otherwise fail
# with "duplicate symbol". The wire format does not depend on the pool.
pb2="$out/batchpilot/runtime/grpc_api/grpc_predict_v2_pb2.py"
sed -i 's/^DESCRIPTOR = _descriptor_pool\.Default()\.AddSerializedFile(/DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile(/' "$pb2"
grep -q '^DESCRIPTOR = _descriptor_pool.DescriptorPool()' "$pb2" || {
    echo "gen-grpc.sh: could not move the messages to their own descriptor pool" >&2
    exit 1
}
