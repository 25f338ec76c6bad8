"""What comes into the engine: the request-side rules, and the messages callers post to the core.

The rules are applied on the caller's thread by `Engine.submit` / `submit_chat` and, before any
weight is loaded, by the CLI's preflight (engine/preflight.py); the engine thread applies
`check_submission` again when it builds the record (doctrine 3). Callers never touch the core's
state: they post a `Submit`, `Cancel` or `Call` to its inbox, which the engine thread drains
at the start of each cycle (G-8).
"""
from __future__ import annotations

import dataclasses
import queue
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ninfer_jax.engine.types import check_prompt
from ninfer_jax.errors import RequestError

if TYPE_CHECKING:
    from ninfer_jax.config import EngineConfig
    from ninfer_jax.engine.request import Request


def check_submission(prompt: Sequence[int], vocab_size: int, max_context: int) -> tuple[int, ...]:
    """A prompt's ids as the engine admits them (doctrine 3): `check_prompt` (non-empty, ints,
    inside the vocabulary, within max_context) and room for one generated token (CFG-1). The one
    rule behind `EngineCore.make_request` and the CLI's preflight."""
    ids = check_prompt(prompt, vocab_size, max_context)
    if len(ids) >= max_context:
        raise RequestError(f"prompt: {len(ids)} tokens leave no room to generate within max_context={max_context}")
    return ids


def load_tokenizer(model: str):
    """The model's tokenizer: the built-in one, or the folder's tokenizer.json; None when the
    folder ships none (the engine then takes token ids only)."""
    import os

    from ninfer_jax.frontend.tokenizer import Tokenizer

    if model.startswith("builtin:") or os.path.exists(os.path.join(model, "tokenizer.json")):
        return Tokenizer.load(model)
    return None  # token ids only


def prompt_ids(prompt, tokenizer, model: str) -> list[int]:
    """A raw prompt (text, or a sequence of token ids) as token ids; RequestError for text
    without a tokenizer or something that is neither."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError(f"{model} ships no tokenizer: pass token ids")
        return tokenizer.encode(prompt)
    if isinstance(prompt, (list, tuple)) and set(map(type, prompt)) <= {int}:
        return list(prompt)  # plain ints already (a long prompt: no per-id conversion)
    try:
        return [int(t) if not isinstance(t, bool) else t for t in prompt]
    except (TypeError, ValueError):
        raise RequestError("prompt: expected text or a sequence of token ids") from None


def media_refusal(config: EngineConfig, has_vision: bool) -> str:
    """Why this engine takes no images or videos ("" when it takes them)."""
    if not has_vision:
        return f"{config.model} is a text-only checkpoint (it holds no vision tower): it takes no images or videos"
    return ""


def chat_frontend(tokenizer, config: EngineConfig, has_vision: bool = False):
    """The chat frontend requests are rendered with (input limited to max_context - 1 tokens);
    media is refused before any of it is read unless the model has a vision tower the steps
    run (`media_refusal`); RequestError when the model ships no tokenizer."""
    if tokenizer is None:
        raise RequestError(f"{config.model} ships no tokenizer: chat needs one")
    import os

    from ninfer_jax.frontend import ChatFrontend

    why = media_refusal(config, has_vision)
    folder = config.model if os.path.isdir(config.model) else None  # its preprocessor configs
    return ChatFrontend(tokenizer, max_input_tokens=config.max_context - 1,
                        media_policy=config.media.policy(enabled=not why, why=why), media_folder=folder)


# ---- the core's inbox: posted from any thread, drained by the engine thread ---------------
@dataclasses.dataclass(frozen=True)
class Submit:
    """A built request record joins the fresh queue."""

    request: Request


@dataclasses.dataclass(frozen=True)
class Cancel:
    """End the request of this id wherever it is (queued, resident, paused)."""

    request_id: str


@dataclasses.dataclass(frozen=True)
class Call:
    """Run `fn` on the engine thread between cycles; `(True, result)` or `(False, exception)`
    is put in `box` for the caller."""

    fn: Callable[[], Any]
    box: queue.SimpleQueue


Message = Submit | Cancel | Call


def message(kind: str, payload) -> Message:
    """The inbox message `Engine` posts for (kind, payload): "submit" (a Request), "cancel" (a
    request id) or "call" (`(fn, box)`)."""
    if kind == "submit":
        return Submit(payload)
    if kind == "cancel":
        return Cancel(payload)
    if kind == "call":
        fn, box = payload
        return Call(fn, box)
    raise ValueError(f"unknown inbox message {kind!r}")
