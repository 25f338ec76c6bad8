"""Preflight: refuse, before any weight is loaded or any step compiled, what the engine would refuse.

    pre = preflight(config, prompt="Hello", sampling={"temperature": 0.0, "max_tokens": 8})
    with Engine(config) as engine:
        engine.submit(prompt, pre.sampling)

It reads only what is cheap — `config.json`, the safetensors headers, the tokenizer — and applies
the engine's own rules, raising the same typed errors the engine raises later (doctrine 3):

- `SamplingParams` validation (`RequestError`, `sampling.FIELD: ...`);
- the model: a built-in name, or a folder with a valid `config.json` (`ConfigError`, the parser
  of `ninfer_jax/model/config.py`), holding safetensors files whose headers read
  (`CheckpointError`, the checkpoint reader's own check; the tensors themselves are matched
  against the config only when the weights load);
- the capacity the config resolves to on that model (`resolve_capacity`: `ConfigError`);
- the folder's generation_config.json sampling defaults (`generation_defaults`: `ConfigError`)
  and a `chat_template` file (`read_chat_template`: read, UTF-8, compiles; `ConfigError`);
- a prompt: text needs a tokenizer, ids must lie in the vocabulary, the prompt must leave room
  under `max_context` (`prompt_ids` and `check_submission`, the rules `Engine.submit` applies);
- chat messages: a tokenizer, the chat template's rendering (`FrontendError`s) and the same
  prompt rule (`chat_frontend`, as `Engine.submit_chat`).

The capacity is checked at the dtype the model will run in (`EngineConfig.resolved_dtype`: for
"auto" the checkpoint's own, read from config.json or the safetensors headers).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ninfer_jax.config import EngineConfig
from ninfer_jax.engine.intake import (chat_frontend, check_submission, generation_defaults, load_tokenizer,
                                     prompt_ids, read_chat_template)
from ninfer_jax.engine.types import SamplingParams
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.plan import Capacity, plan_capacity, with_reach


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What preflight read and checked; `prompt_ids` is set when a prompt or messages were given."""

    config: EngineConfig
    model: ModelConfig
    capacity: Capacity
    tokenizer: Any | None  # ninfer_jax.frontend.tokenizer.Tokenizer, or None (token ids only)
    sampling: SamplingParams | None
    prompt_ids: tuple[int, ...] | None


def model_config(model: str) -> ModelConfig:
    """The ModelConfig of `builtin:tiny-hybrid` or of a folder's config.json, without weights;
    ConfigError for an unknown built-in name, a path that is no folder, or a bad config.json
    (the checks `load_model` makes)."""
    from ninfer_jax.model import builtin
    from ninfer_jax.model.config import load_config
    from ninfer_jax.model.model import check_builtin, check_folder

    if model.startswith("builtin:"):
        check_builtin(model)
        return builtin.config()
    check_folder(model)
    return load_config(model)


def declares_vision(model: str) -> bool:
    """Whether the model's config.json declares a vision tower (read only; no weights)."""
    import json
    import os

    from ninfer_jax.model.multimodal import is_multimodal

    path = os.path.join(model, "config.json")
    if model.startswith("builtin:") or not os.path.isfile(path):
        return False
    with open(path) as f:
        return is_multimodal(json.load(f))


def check_checkpoint_files(model: str) -> None:
    """The checkpoint reader's file check (index, shards present, headers readable, data not cut
    short): CheckpointError. Reads headers only. Nothing to check for a built-in model."""
    if model.startswith("builtin:"):
        return
    from ninfer_jax.model.weights import Tensors

    Tensors(model)


def itemsize(config: EngineConfig) -> int:
    """Bytes per parameter/activation element in the dtype the model will run in."""
    import jax.numpy as jnp
    import numpy as np

    from ninfer_jax.model.model import DTYPES

    return np.dtype(jnp.dtype(DTYPES[config.resolved_dtype])).itemsize


def preflight(config: EngineConfig, prompt: str | Sequence[int] | None = None,
              sampling: SamplingParams | Mapping[str, Any] | None = None,
              messages: Sequence[Mapping[str, Any]] | None = None, *, model: ModelConfig | None = None,
              images: Sequence[bytes] = ()) -> Preflight:
    """Check `config` (and a raw `prompt` or chat `messages`, and `sampling`) as the engine would,
    without loading weights; raise the engine's typed error (RequestError, ConfigError,
    CheckpointError, a FrontendError for messages the chat template refuses) or return what
    was read. `messages=[]` checks only that chat is possible (a tokenizer). `model`: the
    ModelConfig the engine will run (the cost-model Program's); default: config.model's,
    whose checkpoint files are checked too. `images` (with a text prompt): read, decoded and
    placed as `Engine.submit` does (the media's typed errors; a text-only checkpoint refuses)."""
    if not isinstance(config, EngineConfig):
        raise ConfigError("config", f"expected an EngineConfig, got {type(config).__name__}")
    if isinstance(sampling, Mapping):
        sampling = SamplingParams(**sampling)
    elif sampling is not None and not isinstance(sampling, SamplingParams):
        raise ConfigError("sampling", f"expected SamplingParams or a dict, got {type(sampling).__name__}")
    if model is None:
        model = model_config(config.model)
        check_checkpoint_files(config.model)
        generation_defaults(config.model)  # a default SamplingParams refuses fails here, not per request
    if config.chat_template is not None:
        read_chat_template(config.chat_template)
    plan = plan_capacity(config, model, itemsize(config))
    config = with_reach(config, plan)  # CFG-6: a prompt is checked against what Main KV holds
    capacity = plan.capacity
    tokenizer, ids = None, None
    if prompt is not None and messages is not None:
        raise ConfigError("preflight", "pass a raw prompt or chat messages, not both")
    if isinstance(prompt, str) or messages is not None:
        tokenizer = load_tokenizer(config.model, config.chat_template)
    if images:
        if not isinstance(prompt, str):
            raise ConfigError("image", "images go with a text prompt (--prompt) or a chat message")
        expanded = chat_frontend(tokenizer, config, declares_vision(config.model)).expand_prompt(prompt, images)
        ids = check_submission(list(expanded.token_ids), model.vocab_size, config.max_context)
    elif prompt is not None:
        ids = check_submission(prompt_ids(prompt, tokenizer, config.model), model.vocab_size, config.max_context)
    elif messages is not None:
        frontend = chat_frontend(tokenizer, config, declares_vision(config.model))
        if messages:
            rendered = frontend.render_chat(list(messages))
            ids = check_submission(rendered.token_ids, model.vocab_size, config.max_context)
    return Preflight(config=config, model=model, capacity=capacity, tokenizer=tokenizer, sampling=sampling,
                     prompt_ids=ids)
