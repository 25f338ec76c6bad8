"""The HTTP listener: uvicorn serving `server.http_app` on its own thread.

`HttpListener.start()` binds the socket itself (so a port in use fails at once, and port 0
reports the port it got) and returns once uvicorn accepts connections; `stop()` asks uvicorn
to exit and waits for its thread. Draining (refusing new requests, letting running ones end,
cancelling the rest) is the front's, driven by `server.app.InferenceServer.shutdown`.
"""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from server.http_app import OpenAIFront, build_app


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind {host}:{port} for HTTP: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


class HttpListener:
    def __init__(self, front: OpenAIFront, *, host: str = "127.0.0.1", port: int = 0):
        self.front = front
        self.host, self.port = host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> int:
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self.front), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5, server_header=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="ninfer-http",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the HTTP server did not start on {self.address}")
            time.sleep(0.01)
        return self.port

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is None:
            return
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
