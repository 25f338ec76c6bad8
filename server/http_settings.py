"""What `ninfer serve` configures of its HTTP API beyond the shared limits (issue 37): the model
names it answers to, CORS, the access log and request log, and the Responses store's bounds and
folder. One frozen value, built from the flags (server/cli.py) and handed to `OpenAIFront`."""
from __future__ import annotations

from dataclasses import dataclass

from ninfer_jax.frontend.responses import DEFAULT_MAX_RESPONSES

DEFAULT_RESPONSES_BYTES = 64 << 20


@dataclass(frozen=True)
class HttpSettings:
    # Names a request's `model` may give; empty: the model's own name. The first is the one
    # answers and /v1/models report first.
    served_model_names: tuple[str, ...] = ()
    # Origins a browser may call from ("*": any); empty: no CORS headers at all.
    cors_origins: tuple[str, ...] = ()
    # One line per request on stderr (logger "ninfer.http.access").
    access_log: bool = True
    # A file that gets one JSON line per finished generation request; None: none.
    request_log: str | None = None
    # The Responses store: most responses, most bytes (their stored JSON), seconds a response is
    # kept after it was stored (None: until evicted), and a folder that keeps it across restarts.
    max_responses: int = DEFAULT_MAX_RESPONSES
    responses_max_bytes: int = DEFAULT_RESPONSES_BYTES
    responses_ttl_s: float | None = None
    responses_store: str | None = None

    def __post_init__(self):
        if self.max_responses < 1:
            raise ValueError(f"max_responses must be at least 1, got {self.max_responses}")
        if self.responses_max_bytes < 1:
            raise ValueError(f"responses_max_bytes must be at least 1, got {self.responses_max_bytes}")
        if self.responses_ttl_s is not None and not self.responses_ttl_s > 0:
            raise ValueError(f"responses_ttl_s must be positive, got {self.responses_ttl_s}")
        for name in self.served_model_names:
            if not name or name != name.strip():
                raise ValueError(f"served model name {name!r}: a non-empty name without surrounding spaces")
