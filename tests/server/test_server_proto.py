"""The committed stubs are what the pinned grpcio-tools makes of the committed proto."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("ninfer_pb2.py", "ninfer_pb2.pyi", "ninfer_pb2_grpc.py")


def test_stubs_match_the_proto(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    (tmp_path / "server" / "proto").mkdir(parents=True)
    shutil.copy(ROOT / "server/proto/ninfer.proto", tmp_path / "server/proto/ninfer.proto")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = protoc.main(["protoc", "-I", ".", "--python_out=.", "--pyi_out=.", "--grpc_python_out=.",
                          "server/proto/ninfer.proto"])
    finally:
        os.chdir(cwd)
    assert rc == 0
    for name in GENERATED:
        assert (tmp_path / "server/proto" / name).read_text() == (ROOT / "server/proto" / name).read_text(), \
            f"{name} is stale: run scripts/gen_proto.sh"


def test_service_shape():
    from server.proto import ninfer_pb2

    assert ninfer_pb2.DESCRIPTOR.package == "ninfer.v1"
    service = ninfer_pb2.DESCRIPTOR.services_by_name["NInfer"]
    streaming = {m.name: m.server_streaming for m in service.methods}
    assert streaming == {"Generate": True, "Chat": True, "Tokenize": False, "GetModelInfo": False,
                         "GetStats": False}
