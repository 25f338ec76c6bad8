"""Typed errors raised at the boundaries (doctrine 3, docs/rules.md).

Every error a caller can provoke with bad input derives from `NInferError`, so a server can map
the whole family to INVALID_ARGUMENT-like answers while programming errors stay distinct.
"""


class NInferError(Exception):
    """Base of every error caused by input the caller controls."""


class ConfigError(NInferError, ValueError):
    """An engine or model configuration that is unknown, incomplete or inconsistent."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class CheckpointError(NInferError, ValueError):
    """A checkpoint folder whose files are missing, truncated, or hold the wrong tensors."""

    def __init__(self, message: str, *, missing=(), unexpected=(), misshapen=()):
        self.missing = tuple(missing)
        self.unexpected = tuple(unexpected)
        self.misshapen = tuple(misshapen)
        parts = [message]
        if self.missing:
            parts.append(f"missing ({len(self.missing)}): " + ", ".join(self.missing))
        if self.unexpected:
            parts.append(f"unexpected ({len(self.unexpected)}): " + ", ".join(self.unexpected))
        if self.misshapen:
            parts.append(f"misshapen ({len(self.misshapen)}): " + ", ".join(self.misshapen))
        super().__init__("\n  ".join(parts))


class RequestError(NInferError, ValueError):
    """A request that can never be served as given (empty prompt, id outside the vocabulary...)."""


class CapacityError(NInferError):
    """RES-6: after reclaiming optional cache and pausing every other request, this request still
    cannot obtain a legal unit — the configuration cannot serve it (the capacity contract)."""


class QueueFullError(NInferError):
    """The engine's waiting queue is at its configured limit; retry later."""


class EngineClosedError(NInferError):
    """The engine is closed or closing and takes no new requests."""


class EngineFailure(NInferError):
    """TXN-2: an engine cycle raised (a bug, or a device error in a compiled step). The engine's
    single failure cleanup ended every live request with finish_reason "error" and this message,
    and closed the engine for good. Not caused by the request: `cause` is the original exception."""

    def __init__(self, cause: BaseException):
        self.cause = cause
        super().__init__(f"the engine failed in a cycle and is closed: {type(cause).__name__}: {cause}")
