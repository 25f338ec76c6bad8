"""The process around the servicer: gRPC server, health, reflection, auth, warm-up, shutdown.

Life of a server: `start()` binds (127.0.0.1 by default) with health NOT_SERVING; `warm_up()`
builds the engine (loading and compiling), then health turns SERVING; `shutdown()` turns health
NOT_SERVING, refuses new RPCs, lets running streams finish for `grace_s`, cancels the rest, stops
the gRPC server and closes the engine. `serve_until_signal()` runs that whole life on SIGTERM or
SIGINT.

If the engine fails (TXN-2: `engine.failure` is set once its cleanup ended every request), a
watcher turns health NOT_SERVING for good; the servicer refuses new requests; the process keeps
answering health and GetStats until a signal, and its shutdown then has nothing to wait for.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from concurrent import futures
from typing import Any, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from server.auth import BearerTokenInterceptor
from server.limits import ServerLimits
from server.proto import ninfer_pb2, ninfer_pb2_grpc
from server.servicer import NInferServicer, generation_defaults

log = logging.getLogger("ninfer.server")
SERVICE_NAME = ninfer_pb2.DESCRIPTOR.services_by_name["NInfer"].full_name  # "ninfer.v1.NInfer"
HEALTH_NAMES = ("", SERVICE_NAME)


def defaults_line(defaults: dict) -> str:
    """The start line saying which sampling defaults a request's unset fields get."""
    if not defaults:
        return "sampling defaults: SamplingParams' own (no generation_config.json defaults)"
    given = ", ".join(f"{k}={v}" for k, v in defaults.items())
    return f"sampling defaults from generation_config.json (for fields a request leaves unset): {given}"


def bind_address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{port}"


class InferenceServer:
    def __init__(self, engine_factory: Callable[[], Any], *, host: str = "127.0.0.1", port: int | None = 0,
                 token: str | None = None, limits: ServerLimits | None = None, max_workers: int | None = None,
                 grace_s: float = 10.0, close_engine: bool = True, progress: Callable[[str], None] | None = None,
                 http_port: int | None = None, http_settings: Any = None):
        """`port` None: no gRPC listener; `http_port` (None: none) adds the OpenAI-compatible
        HTTP API on the same host, engine, token and limits (docs/http.md), configured by
        `http_settings` (server.http_settings.HttpSettings; None: the defaults)."""
        self.limits = limits or ServerLimits()
        self.host, self.port = host, port
        self.http = None
        if http_port is not None:
            from server.http_app import OpenAIFront
            from server.http_server import HttpListener

            self.http = HttpListener(OpenAIFront(self.limits, token=token, settings=http_settings), host=host, port=http_port)
        if port is None and self.http is None:
            raise ValueError("a server needs a gRPC port, an HTTP port or both")
        self.grace_s = grace_s
        self.engine: Any = None
        self.warm_up_error: BaseException | None = None
        self._engine_factory = engine_factory
        self._close_engine = close_engine
        self._progress = progress or log.info
        self._stopped = threading.Event()
        self._shutdown_lock = threading.Lock()
        self.servicer = NInferServicer(self.limits)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        workers = max_workers or self.limits.max_concurrent_rpcs
        options = [
            ("grpc.max_receive_message_length", self.limits.max_message_bytes),
            ("grpc.max_send_message_length", self.limits.max_message_bytes),
            ("grpc.so_reuseport", 0),  # a port in use is an error, never shared
            # Ping idle connections so a client that vanished without closing (a dead host, a
            # dropped network) is noticed and its requests are cancelled within about 40 s.
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ]
        interceptors = [BearerTokenInterceptor(token)] if token else []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ninfer-rpc"),
                                   options=options, interceptors=interceptors,
                                   maximum_concurrent_rpcs=workers)
        ninfer_pb2_grpc.add_NInferServicer_to_server(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server)
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    @property
    def address(self) -> str:
        return bind_address(self.host, self.port)

    def _set_health(self, status) -> None:
        for name in HEALTH_NAMES:
            self.health.set(name, status)

    def start(self) -> int | None:
        """Bind and start answering (health NOT_SERVING, HTTP /health 503, until `warm_up`).
        Returns the gRPC port (None without gRPC; `http.port` is the HTTP one)."""
        if self.port is not None:
            try:
                port = self._server.add_insecure_port(bind_address(self.host, self.port))
            except RuntimeError as exc:
                raise OSError(f"cannot bind {self.address}: {exc}") from None
            if not port:
                raise OSError(f"cannot bind {self.address}")
            self.port = port
            self._server.start()
            self._progress(f"listening on {self.address} (gRPC; warming up: health NOT_SERVING)")
        if self.http is not None:
            self.http.start()
            self._progress(f"listening on http://{self.http.address} (OpenAI-compatible HTTP; warming up: "
                           f"/health 503)")
        return self.port

    def warm_up(self) -> None:
        """Build the engine, then report SERVING. On failure health stays NOT_SERVING."""
        engine = self._engine_factory()
        with self._shutdown_lock:  # a shutdown that began meanwhile wins
            if self._stopped.is_set() or self.servicer.draining:
                engine.close()
                return
            self.engine = engine
            self.servicer.attach(engine)
            if self.http is not None:
                self.http.front.attach(engine)
            self._set_health(health_pb2.HealthCheckResponse.SERVING)
            threading.Thread(target=self._watch_engine, args=(engine,), name="ninfer-watch", daemon=True).start()
        where = [self.address] if self.port is not None else []
        if self.http is not None:
            where.append(f"http://{self.http.address}")
        self._progress(f"serving {engine.model_info().get('name', '?')} on {' and '.join(where)} (health SERVING)")
        self._progress(defaults_line(generation_defaults(engine)))

    @property
    def engine_failure(self) -> BaseException | None:
        """The engine's failure (TXN-2), or None while it is healthy."""
        return getattr(self.engine, "failure", None)

    def _watch_engine(self, engine, poll_s: float = 0.1) -> None:
        """TXN-2: a failed engine turns health NOT_SERVING for good (it never recovers)."""
        while not self._stopped.wait(poll_s):
            failure = getattr(engine, "failure", None)
            if failure is not None:
                self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)  # a no-op once shutting down
                self._progress(f"engine failed: {failure} (health NOT_SERVING; new requests UNAVAILABLE)")
                return

    def shutdown(self, grace_s: float | None = None) -> None:
        """Stop accepting, let running streams finish within the grace period, cancel the rest."""
        grace = self.grace_s if grace_s is None else grace_s
        with self._shutdown_lock:
            if self._stopped.is_set():
                return
            self.health.enter_graceful_shutdown()  # every name NOT_SERVING, for good
            fronts = [self.servicer] + ([self.http.front] if self.http is not None else [])
            for front in fronts:
                front.start_draining()
            deadline = time.monotonic() + grace
            if not all(f.wait_idle(max(0.0, deadline - time.monotonic())) for f in fronts):
                n = sum(f.cancel_all() for f in fronts)
                self._progress(f"grace period over: cancelled {n} running request(s)")
                for f in fronts:
                    f.wait_idle(5.0)
            if self.port is not None:
                self._server.stop(grace=1.0).wait(10.0)
            if self.http is not None:
                self.http.stop()
                self.http.front.close()
            if self.engine is not None and self._close_engine:
                self.engine.close()
            self._stopped.set()
            self._progress("stopped")

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def serve_until_signal(self) -> None:
        """Start, warm up and serve until SIGTERM or SIGINT, then shut down gracefully; a second
        signal cancels what is still running at once. Must run on the main thread (Python
        delivers signals there)."""
        stop = threading.Event()

        def on_signal(*_):
            if stop.is_set():
                self._progress("second signal: cancelling running requests now")
                self.servicer.cancel_all()
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            warm = threading.Thread(target=self._warm_up_or_stop, args=(stop,), name="ninfer-warmup", daemon=True)
            warm.start()
            while not stop.wait(0.5):
                pass
            self._progress(f"shutting down (grace {self.grace_s:g}s)")
            self.shutdown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _warm_up_or_stop(self, stop: threading.Event) -> None:
        try:
            self.warm_up()
        except BaseException as exc:  # noqa: BLE001 - a server that cannot build its engine exits
            log.debug("warm-up failed", exc_info=exc)
            self._progress(f"warm-up failed: {type(exc).__name__}: {exc}")
            self.warm_up_error = exc
            stop.set()
