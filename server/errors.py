"""Engine and frontend errors -> gRPC status codes (doctrine 3 of docs/rules.md: a clear, typed error).

One table, read top to bottom; the first class that matches wins. Anything not in it is a bug
on our side and answers INTERNAL without the traceback.
"""
from __future__ import annotations

import grpc

from ninfer_jax.errors import (CapacityError, EngineClosedError, EngineFailure, NInferError, QueueFullError,
                               RequestError)
from ninfer_jax.frontend.errors import FrontendError

STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CapacityError, grpc.StatusCode.RESOURCE_EXHAUSTED),   # RES-6, the capacity contract
    (EngineClosedError, grpc.StatusCode.UNAVAILABLE),
    (EngineFailure, grpc.StatusCode.UNAVAILABLE),          # TXN-2: the engine failed, not the request
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (FrontendError, grpc.StatusCode.INVALID_ARGUMENT),
    (NInferError, grpc.StatusCode.INVALID_ARGUMENT),
)


class BadRequest(ValueError):
    """A request the server itself refuses before the engine sees it (limits, malformed fields).
    Its text starts with the field ("sampling.max_tokens: ..."); clients see it as
    "RequestError: <text>", like a RequestError of the engine (docs/server.md "Errors")."""


class DuplicateRequestId(BadRequest):
    """A request_id that names a request still running on this server."""


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and the message a client sees for `exc`."""
    if isinstance(exc, DuplicateRequestId):
        return grpc.StatusCode.ALREADY_EXISTS, f"RequestError: {exc}"
    if isinstance(exc, BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, f"RequestError: {exc}"
    for cls, code in STATUS_OF:
        if isinstance(exc, cls):
            return code, f"{type(exc).__name__}: {exc}"
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})"
