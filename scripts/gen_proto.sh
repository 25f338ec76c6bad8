#!/usr/bin/env bash
# Regenerates the Python stubs of server/proto/ninfer.proto (committed, so a plain
# `pip install` of the project needs no grpcio-tools). Use the pinned grpcio-tools
# (requirements.txt); the generated code must import with the pinned protobuf.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  server/proto/ninfer.proto
python -c "from server.proto import ninfer_pb2, ninfer_pb2_grpc; print('stubs ok:', ninfer_pb2.DESCRIPTOR.package)"
