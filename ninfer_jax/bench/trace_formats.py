"""Trace files for `ninfer trace`: the three input formats, parsed and checked.

A trace is JSONL, one request a line, in one of three formats picked by the first request's
keys (`parse_lines`): chat-level (`messages`, rendered by the model's template during the
replay), Marconi token-level (`input_tokens`, with the recorded `output_tokens` replayed as
forced outputs and optional save points) and Mooncake / AIPerf (`hash_ids`, each standing for a
block of `MOONCAKE_BLOCK` tokens, `mooncake_block`). Every malformed line is a `TraceError`
naming the file, the line and what is wrong; `check_vocab` refuses token ids beyond the
vocabulary the trace is replayed on, and `request_tokens` / `longest_request` size a request
for the cache byte budget (trace_sweep.py).
"""
from __future__ import annotations

import dataclasses
import json
import random
from typing import Iterable, Sequence

FORMATS = ("chat", "marconi", "mooncake")
MOONCAKE_BLOCK = 512  # tokens per hash_id block in Mooncake / AIPerf traces


class TraceError(ValueError):
    """A malformed trace: names the file, the line and what is wrong with it."""


# ---- the three input formats -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TraceRequest:
    index: int  # line order
    session: str
    turn: int
    ts: float
    max_tokens: int | None  # None: the command's --max_tokens
    prompt_ids: tuple[int, ...] | None = None  # token-level (Marconi)
    messages: tuple[dict, ...] = ()  # chat-level: messages this request adds to the history
    tools: tuple[dict, ...] | None = None  # chat-level: the session's tools from here on
    cache_markers: tuple | None = None
    reply: dict | None = None  # chat-level: the assistant message appended after the request
    full_history: bool = False  # chat-level: `messages` is the whole conversation
    ignore_eos: bool = False  # token-level: generate exactly num_output_tokens
    # token-level: explicit save points (Engine.submit's recovery_point, anchors, markers)
    recovery_point: int | None = None
    anchors: tuple[int, ...] = ()
    markers: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Trace:
    format: str
    requests: tuple[TraceRequest, ...]
    output_tokens: tuple[tuple[int, ...], ...] = ()  # token-level: the trace's recorded outputs

    @property
    def sessions(self) -> int:
        return len({r.session for r in self.requests})


def _need(obj: dict, key: str, kinds: tuple, where: str, optional: bool = False):
    """obj[key] checked against `kinds` (a bool is not an int here); None when optional and absent."""
    value = obj.get(key)
    if value is None:
        if optional:
            return None
        raise TraceError(f"{where}: missing {key!r}")
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise TraceError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _ids(value, key: str, where: str) -> tuple[int, ...]:
    # whole-list checks at C speed (a long agent trace holds tens of millions of ids); a bool's
    # type is bool, so `true` is refused as before
    if not isinstance(value, list) or not set(map(type, value)) <= {int} or (value and min(value) < 0):
        raise TraceError(f"{where}: {key!r} must be a list of non-negative integer token ids")
    return tuple(value)


def _chat_request(obj: dict, where: str, index: int) -> TraceRequest:
    messages = _need(obj, "messages", (list,), where)
    if not messages or any(not isinstance(m, dict) or "role" not in m for m in messages):
        raise TraceError(f"{where}: 'messages' must be a non-empty list of messages with a 'role'")
    tools = _need(obj, "tools", (list,), where, optional=True)
    markers = _need(obj, "cache_markers", (list,), where, optional=True)
    reply = obj.get("reply")
    if isinstance(reply, str):
        reply = {"role": "assistant", "content": reply}
    if reply is not None and (not isinstance(reply, dict) or reply.get("role", "assistant") != "assistant"):
        raise TraceError(f"{where}: 'reply' must be an assistant message or a string")
    max_tokens = _need(obj, "max_tokens", (int,), where, optional=True)
    if max_tokens is not None and max_tokens < 1:
        raise TraceError(f"{where}: 'max_tokens' must be positive")
    session = obj.get("session")
    turn = _need(obj, "turn", (int,), where, optional=True)
    ts = _need(obj, "ts", (int, float), where, optional=True)
    return TraceRequest(
        index=index, session=f"line-{index}" if session is None else str(session),
        turn=index if turn is None else turn, ts=float(index if ts is None else ts), max_tokens=max_tokens,
        messages=tuple(messages), tools=None if tools is None else tuple(tools),
        cache_markers=None if markers is None else tuple(markers),
        reply=None if reply is None else dict(reply, role="assistant"), full_history=bool(obj.get("full_history")))


def _marconi_request(obj: dict, where: str, index: int) -> tuple[TraceRequest, tuple[int, ...]]:
    session = _need(obj, "session_id", (int, str), where)
    turn = _need(obj, "turn_id", (int,), where)
    ts = _need(obj, "ts", (int, float), where)
    prompt = _ids(_need(obj, "input_tokens", (list,), where), "input_tokens", where)
    output = _ids(obj.get("output_tokens") or [], "output_tokens", where)
    if not prompt:
        raise TraceError(f"{where}: 'input_tokens' is empty")
    n_in = _need(obj, "num_input_tokens", (int,), where, optional=True)
    if n_in is not None and n_in != len(prompt):
        raise TraceError(f"{where}: num_input_tokens={n_in} but input_tokens holds {len(prompt)} ids")
    n_out = _need(obj, "num_output_tokens", (int,), where, optional=True)
    if n_out is None:
        n_out = len(output)
    if n_out < 0 or output and n_out != len(output):
        raise TraceError(f"{where}: num_output_tokens={n_out} but output_tokens holds {len(output)} ids")
    saves = _save_points(obj, where, len(prompt))
    req = TraceRequest(index=index, session=str(session), turn=turn, ts=float(ts), max_tokens=max(1, n_out),
                       prompt_ids=prompt, ignore_eos=True, **saves)
    return req, output


def _save_points(obj: dict, where: str, n: int) -> dict:
    """Optional `recovery_point` (int), `anchors` and `markers` (lists of at most 4 ints): token
    frontiers in [1, n] where the client knows its chat structure lies."""
    out: dict = {}
    rp = _need(obj, "recovery_point", (int,), where, optional=True)
    if rp is not None:
        if not 1 <= rp <= n:
            raise TraceError(f"{where}: 'recovery_point' {rp} outside [1, {n}]")
        out["recovery_point"] = rp
    for key in ("anchors", "markers"):
        values = _need(obj, key, (list,), where, optional=True)
        if values is None:
            continue
        if len(values) > 4 or any(not isinstance(f, int) or isinstance(f, bool) or not 1 <= f <= n for f in values):
            raise TraceError(f"{where}: {key!r} must be at most 4 token frontiers in [1, {n}]")
        out[key] = tuple(values)
    return out


def mooncake_block(hash_id: int, size: int = MOONCAKE_BLOCK) -> tuple[int, ...]:
    """The token ids standing for one hash block: a pure function of the hash id, in [1, 1000)
    (inside every vocabulary the tool replays on), so equal hash ids give equal blocks and
    different ones practically never share a prefix."""
    rng = random.Random(hash_id * 2654435761 + 97)
    return tuple(rng.randrange(1, 1000) for _ in range(size))


def _mooncake_request(obj: dict, where: str, index: int, block: int) -> TraceRequest:
    ts = _need(obj, "timestamp", (int, float), where)
    n_in = _need(obj, "input_length", (int,), where)
    n_out = _need(obj, "output_length", (int,), where)
    hashes = _ids(_need(obj, "hash_ids", (list,), where), "hash_ids", where)
    if n_in < 1:
        raise TraceError(f"{where}: 'input_length' must be positive")
    if n_out < 0:
        raise TraceError(f"{where}: 'output_length' must be non-negative")
    if len(hashes) != -(-n_in // block):
        raise TraceError(f"{where}: input_length={n_in} needs {-(-n_in // block)} hash_ids of {block} tokens, "
                         f"got {len(hashes)}")
    prompt = tuple(t for h in hashes for t in mooncake_block(h, block))[:n_in]
    session = obj.get("session_id")
    if session is not None and not isinstance(session, (int, str)):
        raise TraceError(f"{where}: 'session_id' must be an int or a string")
    # Without sessions every request is its own conversation, issued at its timestamp.
    return TraceRequest(index=index, session=str(session) if session is not None else f"r{index}",
                        turn=index if session is not None else 0, ts=float(ts) / 1000.0, max_tokens=max(1, n_out),
                        prompt_ids=prompt, ignore_eos=True)


def parse_lines(lines: Iterable[str], fmt: str = "auto", name: str = "trace") -> Trace:
    """Parse JSONL lines (blank lines skipped). `fmt` auto picks by the first request's keys."""
    if fmt not in ("auto",) + FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; choose auto, chat, marconi or mooncake")
    requests, outputs = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: a line must be a JSON object")
        if fmt == "auto":
            fmt = ("marconi" if "input_tokens" in obj else "chat" if "messages" in obj
                   else "mooncake" if "hash_ids" in obj else fmt)
            if fmt == "auto":
                raise TraceError(f"{where}: neither a chat request ('messages'), a Marconi request "
                                 f"('input_tokens') nor a Mooncake request ('hash_ids')")
        if fmt == "chat":
            requests.append(_chat_request(obj, where, len(requests)))
        elif fmt == "mooncake":
            requests.append(_mooncake_request(obj, where, len(requests), MOONCAKE_BLOCK))
            outputs.append(())
        else:
            req, out = _marconi_request(obj, where, len(requests))
            requests.append(req)
            outputs.append(out)
    if not requests:
        raise TraceError(f"{name}: no requests")
    _check_turns(requests, name)
    return Trace(fmt, tuple(requests), output_tokens=tuple(outputs))


def _check_turns(requests: Sequence[TraceRequest], name: str) -> None:
    seen: dict[str, set] = {}
    for r in requests:
        turns = seen.setdefault(r.session, set())
        if r.turn in turns:
            raise TraceError(f"{name}: session {r.session!r} has turn {r.turn} twice")
        turns.add(r.turn)


def load_trace(path: str, fmt: str = "auto") -> Trace:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_lines(f, fmt, name=path)
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror}") from None


def check_vocab(trace: Trace, vocab_size: int, model: str = "the model") -> None:
    """A token-level trace must lie inside the vocabulary it is replayed on: ids are never
    folded (folding invents shared prefixes). TraceError naming the first request beyond it."""
    if trace.format not in ("marconi", "mooncake"):
        return
    for r, out in zip(trace.requests, trace.output_tokens or ((),) * len(trace.requests)):
        top = max(r.prompt_ids + tuple(out))
        if top >= vocab_size:
            raise TraceError(f"request {r.index} (session {r.session!r}, turn {r.turn}) has token id {top}, beyond "
                             f"the vocabulary of {model} ({vocab_size}): replay it on a model whose vocabulary "
                             f"covers the trace (`--program=sim --model=FOLDER` needs only a config.json)")


# ---- request sizes ------------------------------------------------------------------------------
def request_tokens(req: TraceRequest, forced: Sequence[int] = (), default_max_tokens: int = 32) -> int:
    """Tokens a token-level request needs in one context: its prompt and the output it is
    replayed with (the forced output, else its output length, else `default_max_tokens`)."""
    return len(req.prompt_ids or ()) + (len(forced) if forced else req.max_tokens or default_max_tokens)


def longest_request(trace: Trace, default_max_tokens: int = 32) -> tuple[int, int] | None:
    """(tokens, index) of the token-level trace's longest request; None for a chat-level trace,
    whose prompts are known only once rendered during the replay."""
    if trace.format == "chat":
        return None
    outs = trace.output_tokens or ((),) * len(trace.requests)
    return max((request_tokens(r, o, default_max_tokens), r.index) for r, o in zip(trace.requests, outs))
