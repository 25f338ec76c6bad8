"""What client and server agree a request may hold, checked by the client before it sends one.

A request the server would refuse as INVALID_ARGUMENT is refused by `server.client` before
anything goes on the wire, with `ClientRequestError`: a `grpc.RpcError` whose `.code()` is
`INVALID_ARGUMENT` and whose `.details()` is the text the server sends for the same request
(`RequestError: sampling.seed: must be an int in [0, 2**63), got -5`), so a caller handles a
local and a remote refusal the same way. Values the protocol cannot carry at all (`max_tokens`
beyond int32, a negative seed, text where a number belongs) are refused the same way instead of
surfacing as protobuf's `ValueError`/`TypeError`.

The sampling ranges mirror `ninfer_jax.engine.types.SamplingParams` in `SAMPLING_BOUNDS` (the
client imports only grpc and the stubs, never the engine); tests/server/test_client_validation.py
checks the table against SamplingParams at every boundary so the two cannot drift. Limits the
server is configured with (`ServerLimits`, the model's vocabulary and context) are the server's
to check: the client does not know them.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Set
from typing import Any

import grpc

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
UINT64_MAX = 2 ** 64 - 1

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
REQUEST_ID_RULE = "1-128 characters of [A-Za-z0-9._:-]"
MAX_STOP_STRINGS = 16  # SamplingParams: at most 16 stop strings

# The servicer's answer while the engine loads (UNAVAILABLE); a waiting client recognises it.
WARMING_UP = "server is warming up (loading and compiling the model)"


class ClientRequestError(grpc.RpcError):
    """A request refused by the client before sending: shaped like the server's INVALID_ARGUMENT
    answer (`.code()`, `.details()`), so `except grpc.RpcError` handles both."""

    def __init__(self, field: str, why: str):
        self.field = field
        self.why = why
        self._details = f"RequestError: {field}: {why}"
        super().__init__(self._details)

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()

    def debug_error_string(self) -> str:
        return f"refused by the client before sending: {self._details}"

    def __str__(self) -> str:
        return self._details

    def __repr__(self) -> str:
        return f"ClientRequestError({self._details!r})"


def _fail(field: str, why: str):
    raise ClientRequestError(field, why)


# --- sampling ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Bound:
    """One numeric SamplingParams field: its type, its range and SamplingParams' words for it."""

    kind: str                      # "real" (a double on the wire) or "int"
    lo: float | int | None
    lo_open: bool
    hi: float | int | None
    hi_open: bool
    rule: str                      # SamplingParams' message, before ", got VALUE"
    wire_max: int | None = None    # the largest value the proto field carries, when tighter

    def accepts(self, value: Any) -> bool:
        # Exactly SamplingParams' tests: bool counts as an int, NaN lies in no range.
        if not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if self.lo is not None and not (self.lo < value if self.lo_open else self.lo <= value):
            return False
        if self.hi is not None and not (value < self.hi if self.hi_open else value <= self.hi):
            return False
        return True


# In SamplingParams' order of checks (the first bad field is the one reported).
SAMPLING_BOUNDS: dict[str, Bound] = {
    "temperature": Bound("real", 0, False, 100, False, "must lie in [0, 100]"),
    "top_k": Bound("int", 0, False, None, False, "must be a non-negative int (0 = off)", INT32_MAX),
    "top_p": Bound("real", 0, True, 1, False, "must lie in (0, 1]"),
    "min_p": Bound("real", 0, False, 1, False, "must lie in [0, 1]"),
    "repetition_penalty": Bound("real", 0, True, 10, False, "must lie in (0, 10]"),
    "presence_penalty": Bound("real", -2, False, 2, False, "must lie in [-2, 2]"),
    "frequency_penalty": Bound("real", -2, False, 2, False, "must lie in [-2, 2]"),
    "seed": Bound("int", 0, False, 2 ** 63, True, "must be an int in [0, 2**63)"),  # uint64 on the wire
    "max_tokens": Bound("int", 1, False, None, False, "must be a positive int", INT32_MAX),
    "logprobs": Bound("int", 0, False, 20, False, "must be an int in [0, 20]", INT32_MAX),
    "min_tokens": Bound("int", 0, False, None, False, "must be a non-negative int", INT32_MAX),
    "prompt_logprobs": Bound("int", 0, False, 20, False, "must be an int in [0, 20]", INT32_MAX),
}
DEFAULT_MAX_TOKENS = 128  # SamplingParams.max_tokens' default (the client does not import the engine)
# SamplingParams fields the protocol does not carry, each with why (refused when set): a replay's
# forced output (`ninfer trace`, in process).
UNCARRIED_FIELDS = {"forced_output": "replay only: the protocol does not carry it"}
STRUCTURED_KINDS = ("json_object", "json_schema", "regex", "choice", "lark", "tool_calls")  # engine/grammar.py's
# Every other SamplingParams field, in its order of checks (the bools are not range-checked).
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos", "logprobs",
                   "min_tokens", "include_stop_str_in_output", "structured_output", "prompt_logprobs")


def check_structured(value: Any) -> tuple[str, str]:
    """(kind, spec as JSON) of a structured output: a mapping {"kind", "spec"} or an object with
    those attributes (the engine's StructuredOutput). The server checks the spec itself."""
    field = "sampling.structured_output"
    kind, spec = ((value.get("kind"), value.get("spec")) if isinstance(value, Mapping)
                  else (getattr(value, "kind", None), getattr(value, "spec", None)))
    if kind not in STRUCTURED_KINDS:
        _fail(f"{field}.kind", f"must be one of {STRUCTURED_KINDS}, got {kind!r}")
    if kind in ("json_schema", "tool_calls") and isinstance(spec, str):  # JSON text already (the engine's form)
        return kind, spec
    try:
        return kind, "" if spec is None else json.dumps(spec if not isinstance(spec, tuple) else list(spec))
    except (TypeError, ValueError) as exc:
        _fail(f"{field}.spec", f"must be JSON-serialisable ({exc})")


def _too_big_for_wire(field: str, value: int, wire_max: int) -> None:
    _fail(field, f"must be at most {wire_max} (the protocol's int32), got {value!r}")


def check_sampling(sampling: Any) -> dict[str, Any] | None:
    """The fields to send (unset ones left out), checked like SamplingParams and against what
    the proto carries. `sampling`: None, a mapping of SamplingParams fields, or a SamplingParams."""
    if sampling is None:
        return None
    if dataclasses.is_dataclass(sampling) and not isinstance(sampling, type):
        sampling = {f.name: getattr(sampling, f.name) for f in dataclasses.fields(sampling)}
        for name, why in UNCARRIED_FIELDS.items():  # unset (empty) in a SamplingParams that needs none
            if sampling.pop(name, None):
                _fail(f"sampling.{name}", why)
    elif not isinstance(sampling, Mapping):
        _fail("sampling", f"must be a mapping of SamplingParams fields or a SamplingParams, "
                          f"got {type(sampling).__name__}")
    unknown = [k for k in sampling if k not in SAMPLING_FIELDS]
    if unknown:
        _fail("sampling", f"unknown field {unknown[0]!r} (the fields are {', '.join(SAMPLING_FIELDS)})")
    out: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        value = sampling.get(name)
        if value is None:
            continue
        field = f"sampling.{name}"
        bound = SAMPLING_BOUNDS.get(name)
        if bound is not None:
            if not bound.accepts(value):
                _fail(field, f"{bound.rule}, got {value!r}")
            if bound.wire_max is not None and value > bound.wire_max:
                _too_big_for_wire(field, value, bound.wire_max)
            out[name] = int(value) if bound.kind == "int" else float(value)
        elif name == "stop":
            stops = (value,) if isinstance(value, str) else value
            if not isinstance(stops, (list, tuple)) or any(not isinstance(s, str) or not s for s in stops):
                _fail(field, "must be non-empty strings")
            if len(stops) > MAX_STOP_STRINGS:
                _fail(field, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
            if stops:
                out[name] = list(stops)
        elif name == "stop_token_ids":
            if not isinstance(value, (list, tuple)) or any(not isinstance(t, int) or t < 0 for t in value):
                _fail(field, "must be non-negative ints")
            for t in value:
                if t > INT32_MAX:
                    _too_big_for_wire(field, t, INT32_MAX)
            if value:
                out[name] = [int(t) for t in value]
        elif name == "structured_output":
            out[name] = check_structured(value)
        elif name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(value, bool) and value not in (0, 1):
                _fail(field, f"must be a bool, got {value!r}")
            out[name] = bool(value)
    most = out.get("max_tokens", DEFAULT_MAX_TOKENS)
    if out.get("min_tokens", 0) > most:
        _fail("sampling.min_tokens", f"must not exceed max_tokens ({most}), got {out['min_tokens']}")
    return out


# --- prompt, ids ---------------------------------------------------------------------------------
def _is_list_like(value: Any) -> bool:
    """An ordered collection (list, tuple, range, iterator...), not text, bytes, a mapping or a set."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, bytearray, Mapping, Set))


def check_prompt(prompt: Any) -> str | list[int]:
    """Text, or token ids (a list, tuple, range, iterator or array of ints)."""
    if isinstance(prompt, str):
        return prompt
    if hasattr(prompt, "tolist") and not isinstance(prompt, (bytes, bytearray)):
        prompt = prompt.tolist()  # a numpy array
    if not _is_list_like(prompt):
        _fail("prompt", f"must be text (str) or a list of token ids (ints), got {type(prompt).__name__}")
    ids = list(prompt)
    if not ids:
        _fail("prompt", "empty")
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool):
            _fail("prompt", f"token ids must be ints, got {t!r}")
        if not INT32_MIN <= t <= INT32_MAX:
            _fail("prompt", f"token id {t} outside the vocabulary (the protocol carries int32 ids)")
    return ids


def check_request_id(request_id: Any) -> str:
    if request_id is None:
        return ""
    if not isinstance(request_id, str):
        _fail("request_id", f"must be a string, got {type(request_id).__name__}")
    if request_id and not REQUEST_ID.match(request_id):
        _fail("request_id", REQUEST_ID_RULE)
    return request_id


def check_text(value: Any, field: str, *, optional: bool = True) -> str | None:
    """A string field (None allowed when optional)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        _fail(field, f"must be a string, got {type(value).__name__}")
    return value


def check_int32(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(field, f"must be an int, got {value!r}")
    if not INT32_MIN <= value <= INT32_MAX:
        _fail(field, f"must fit the protocol's int32, got {value!r}")
    return value


def to_json(value: Any, field: str) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        _fail(field, f"not JSON-serializable ({exc})")


# --- chat ----------------------------------------------------------------------------------------
def _list_of(value: Any, field: str, what: str) -> list:
    if not _is_list_like(value):
        _fail(field, f"must be a list of {what}, got {type(value).__name__}")
    return list(value)


def _mapping(value: Any, field: str, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        _fail(field, f"must be {what}, got {type(value).__name__}")
    return value


def check_messages(messages: Any) -> list[Mapping]:
    """A list of message mappings (each checked by the proto builder as it goes)."""
    items = _list_of(messages, "messages", "messages")
    for i, m in enumerate(items):
        _mapping(m, f"messages[{i}]", "a message (a mapping with role and content)")
    return items


def check_list(value: Any, field: str, what: str) -> list:
    if value is None:
        return []
    return _list_of(value, field, what)


def check_mapping(value: Any, field: str, what: str) -> Mapping:
    return _mapping(value, field, what)


def check_token(token: Any) -> str | None:
    """A bearer token travels in a header: printable ASCII only."""
    if token is None or token == "":
        return None
    if not isinstance(token, str) or not all(" " <= c <= "~" for c in token):
        _fail("token", "must be printable ASCII (it travels in the authorization header)")
    return token
