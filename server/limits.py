"""Request limits the server checks before anything reaches the engine (safe defaults).

The engine validates what it knows (vocabulary, max_context, sampling ranges); these bound what
a single RPC may ask of the process: message bytes, prompt characters, list lengths, ids.
"""
from __future__ import annotations

import dataclasses

from server.errors import BadRequest
from server.validate import REQUEST_ID, REQUEST_ID_RULE


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_message_bytes: int = 8 << 20     # one request or response message on the wire
    max_prompt_chars: int = 1 << 20      # a text prompt, or all chat text together
    max_messages: int = 1024             # chat messages per request
    max_parts: int = 256                 # content parts per message
    max_tools: int = 128
    max_tokens: int | None = None        # sampling.max_tokens cap; None = the model's max_context
    max_concurrent_rpcs: int = 1024      # beyond this gRPC answers RESOURCE_EXHAUSTED itself

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"ServerLimits.{f.name}: must be a positive int, got {value!r}")

    def check_request_id(self, request_id: str) -> str | None:
        if not request_id:
            return None
        if not REQUEST_ID.match(request_id):
            raise BadRequest(f"request_id: {REQUEST_ID_RULE}")  # the client checks the same rule
        return request_id

    def check_chars(self, n: int, what: str) -> None:
        if n > self.max_prompt_chars:
            raise BadRequest(f"{what}: {n} characters exceed the server limit of {self.max_prompt_chars}")

    def check_count(self, n: int, limit: int, what: str) -> None:
        if n > limit:
            raise BadRequest(f"{what}: {n} exceed the server limit of {limit}")

    def check_max_tokens(self, max_tokens: int, max_context: int) -> None:
        cap = self.max_tokens if self.max_tokens is not None else max_context
        if max_tokens > cap:
            raise BadRequest(f"sampling.max_tokens: {max_tokens} exceeds the server limit of {cap}")
