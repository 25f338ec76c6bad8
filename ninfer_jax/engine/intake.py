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


def load_tokenizer(model: str, chat_template: str | None = None):
    """The model's tokenizer: the built-in one, or the folder's tokenizer.json; None when the
    folder ships none (the engine then takes token ids only). `chat_template`: a jinja file whose
    text replaces the tokenizer's own template (`read_chat_template`; EngineConfig.chat_template)."""
    import os

    from ninfer_jax.frontend.tokenizer import Tokenizer

    if model.startswith("builtin:") or os.path.exists(os.path.join(model, "tokenizer.json")):
        tokenizer = Tokenizer.load(model)
        if chat_template is not None:
            tokenizer.chat_template = read_chat_template(chat_template)
        return tokenizer
    return None  # token ids only


def read_chat_template(path: str) -> str:
    """The jinja text of a chat template file (`--chat_template`), compiled once to check it:
    ConfigError("chat_template", ...) for a missing or unreadable file, text that is not UTF-8,
    an empty file or a template that does not compile. Read before any weight is loaded."""
    from ninfer_jax.errors import ConfigError
    from ninfer_jax.frontend.errors import TemplateError
    from ninfer_jax.frontend.sandbox import ChatTemplate

    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError("chat_template", f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError("chat_template", f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("chat_template", f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise ConfigError("chat_template", f"{path}: the file is empty")
    try:
        ChatTemplate(text)
    except TemplateError as exc:
        raise ConfigError("chat_template", f"{path}: {exc}") from None
    return text


# generation_config.json fields that are sampling defaults, as SamplingParams names them (vLLM reads
# the same ones; transformers writes the first five; the penalties where a checkpoint sets them).
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                       "frequency_penalty")


def generation_defaults(model: str) -> dict:
    """The sampling defaults of a checkpoint folder's generation_config.json: its fields among
    `GENERATION_DEFAULTS` that are set (not null), for the fields a server request leaves unset.
    {} for the built-in model or a folder without the file. ConfigError("generation_config.json",
    ...) for a file that does not read or a value SamplingParams refuses, so a bad default fails
    at load, never per request."""
    import json
    import os

    from ninfer_jax.engine.types import SamplingParams
    from ninfer_jax.errors import ConfigError, RequestError

    path = os.path.join(model, "generation_config.json")
    if model.startswith("builtin:") or not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("generation_config.json", f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("generation_config.json", f"{path}: expected a JSON object")
    out = {k: data[k] for k in GENERATION_DEFAULTS if data.get(k) is not None}
    for key, value in out.items():
        if isinstance(value, bool):
            raise ConfigError("generation_config.json", f"{key}: must be a number, got {value!r}")
    try:
        SamplingParams(**out)
    except RequestError as exc:
        raise ConfigError("generation_config.json", str(exc).removeprefix("sampling.")) from None
    return out


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
