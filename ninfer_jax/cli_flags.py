"""The flags of ninfer_jax's commands (absl), and the values they build: an `EngineConfig`, the
`SamplingParams`, a prompt, chat messages, the user turns on stdin.

Flags are named like the Python API. Sampling and engine flags carry no absl bounds:
`SamplingParams` and `EngineConfig` are the one rule, and their typed errors are what the CLI
reports (exit 2, before the model loads). The server's own flags (`serve`, `--server`) are
defined by the server's CLI (server/cli.py).
"""
from __future__ import annotations

import json
import sys

from absl import flags

FLAGS = flags.FLAGS

flags.DEFINE_string("model", "builtin:tiny-hybrid", "Checkpoint folder (config.json, safetensors, tokenizer.json) or "
                    "builtin:tiny-hybrid.")
flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16"],
                  "Parameter and activation dtype; auto: the checkpoint's own.")
flags.DEFINE_string("prompt", "Hello", "Prompt text.")
flags.DEFINE_string("token_ids", None, "Comma-separated prompt token ids (instead of --prompt).")
flags.DEFINE_multi_string("image", None, "generate/chat: an image file sent with the prompt (repeat for several); "
                          "needs a checkpoint with a vision tower.")
flags.DEFINE_integer("media_cache_bytes", None, "Engine: bytes of vision tower outputs kept for reuse (the media "
                     "cache; 0: none), apart from the Host context capacity.")
flags.DEFINE_string("allowed_local_media_path", None, "Engine: file:// image URLs are read only under this folder.")
flags.DEFINE_bool("allow_media_urls", False, "Engine: fetch http(s) image and video URLs (at most the media byte "
                  "limit, 10 s per connection and read); without it no network connection is opened.")
flags.DEFINE_integer("max_input_pixels", None, "Engine: the most pixels of one image or video frame.")
flags.DEFINE_integer("max_input_frames", None, "Engine: the most frames of one video.")
flags.DEFINE_integer("max_tokens", 32, "Tokens to generate.")
flags.DEFINE_float("temperature", 0.0, "Sampling temperature in [0, 100]; 0 is greedy.")
flags.DEFINE_integer("seed", 0, "Sampling seed in [0, 2**63).")
flags.DEFINE_bool("json", False, "bench, trace, plan, lower: print one JSON object.")
flags.DEFINE_string("chat_template", None, "Engine: a jinja file whose text replaces the tokenizer's chat template "
                    "(chat, serve); read and compiled before the model loads.")
flags.DEFINE_integer("max_concurrency", None, "Engine: requests decoded together (C, 1..8).")
flags.DEFINE_integer("max_context", None, "Engine: longest prompt + generation, in tokens.")
flags.DEFINE_integer("chunk_size", None, "Engine: prefill chunk length in tokens.")
flags.DEFINE_integer("kv_capacity", None, "Engine: Main KV capacity in tokens.")
flags.DEFINE_integer("speculative_tokens", None, "Engine: draft tokens verified per decode step (0 = off; 1..4 "
                     "with mtp, which needs an MTP head; up to the drafter's block_size - 1 with dflash).")
flags.DEFINE_string("speculative_method", None, "Engine: where drafts come from: mtp (the model's MTP head) or "
                    "dflash (the DFlash drafter in --draft_model).")
flags.DEFINE_string("draft_model", None, "Engine: a DFlash drafter folder as published (config.json + "
                    "safetensors), or builtin:tiny-hybrid-dflash (the built-in model's), with "
                    "--speculative_method=dflash.")
flags.DEFINE_enum("pause_route", None, ["auto", "snapshot", "replay"],
                  "Engine: how a preempted request keeps its work (auto: the cost model compares copying to Host "
                  "with recomputing).")
flags.DEFINE_integer("device_state_slots", None, "Context cache: device StateImage slots beyond the C basic ones.")
flags.DEFINE_integer("host_capacity_bytes", None, "Context cache: Host arena bytes.")
flags.DEFINE_integer("device_memory_bytes", None, "Engine: the device's memory in bytes, instead of asking the device "
                     "(plan: a device with this many bytes).")
flags.DEFINE_float("device_memory_fraction", None, "Engine: the share of the device's memory the capacity plan may "
                   "fill, in (0, 1].")
flags.DEFINE_string("compilation_cache", None, "Folder for JAX's persistent compilation cache (default: "
                    "$NINFER_COMPILATION_CACHE, else ~/.cache/ninfer/jax); 'off' disables it")
flags.DEFINE_string("messages", None, "chat: JSON list of messages, or @FILE (default: one user message with "
                    "--prompt).")
flags.DEFINE_string("session", None, "chat: session id.")
flags.DEFINE_integer("turns", None, "chat: a multi-turn conversation of up to N user messages read from stdin, one "
                     "per line (also without --turns when stdin holds lines).", lower_bound=1)
flags.DEFINE_enum("program", "model", ["model", "sim"], "trace: the real model or the cost-model Program; bench "
                  "preempt: run only this one (default both).")
flags.DEFINE_enum("trace_format", "auto", ["auto", "chat", "marconi", "mooncake"],
                  "trace: chat-level, Marconi token-level or Mooncake hash-block JSONL (auto: by the first line).")
flags.DEFINE_string("cost", None, "trace --program=sim: a JSON file of the cost model's step and copy costs "
                    "(default: the model folder's cost.json, else the built-in figures).")
flags.DEFINE_string("report", None, "trace: write the figures as JSON, PNG plots (TTFT CDF, reuse by turn, pool "
                    "occupancy, pauses) and summary.md into this folder.")
flags.DEFINE_integer("trace_limit", None, "trace: replay only the first N requests.", lower_bound=1)
flags.DEFINE_bool("cold", True, "trace: also replay with the context cache off (the TTFT baseline).")
flags.DEFINE_bool("branch_points", None, "Context cache: offer raw prompts a shared save point where they leave "
                  "every recently seen prompt (default on).")
flags.DEFINE_integer("cache_device_bytes", None, "trace --program=sim, plan: N device bytes shared by Main KV pages, "
                     "StateImage slots and backend pools, instead of the device-memory solve (\"what if the cache "
                     "had N bytes\").")
flags.DEFINE_float("split", None, "trace, plan: the StateImage share of --cache_device_bytes, in (0, 1) (default: "
                   "one StateImage per max_context/4 of Main KV, 2C slots at least where Main KV keeps one "
                   "max_context).")
flags.DEFINE_string("split_sweep", None, "trace: replay --cache_device_bytes at each of these comma-separated "
                    "StateImage shares (or 'default'), report each and the best.")
flags.DEFINE_bool("skip_too_long", False, "trace: report the requests that cannot fit max_context "
                  "(requests_too_long) and replay the rest, instead of refusing the replay; with "
                  "--cache_device_bytes, max_context is bounded by what Main KV holds.")
flags.DEFINE_string("platform", "cuda", "lower: the platform to lower for: cuda, rocm or cpu (no device of that "
                    "kind is needed).")
flags.DEFINE_string("backend", None, "lower: the kernels' backend: pallas (the Triton kernels), xla (their pure-JAX "
                    "references) or interpret.")
flags.DEFINE_string("steps", None, "lower: only the steps whose names start with one of these comma-separated "
                    "prefixes, or of these kinds (step, head, mover, kernel).")
flags.DEFINE_bool("quick", False, "bench preempt: the smallest run (the cost-model Program only, seconds).")


class UsageError(Exception):
    """A command line the CLI itself cannot read (not a request or config the engine refuses)."""


def engine_settings() -> dict:
    """The engine flags as EngineConfig / ContextCacheConfig fields (None: not given)."""
    return {"dtype": FLAGS.dtype, "max_concurrency": FLAGS.max_concurrency, "max_context": FLAGS.max_context,
            "chunk_size": FLAGS.chunk_size, "kv_capacity": FLAGS.kv_capacity, "pause_route": FLAGS.pause_route,
            "speculative_tokens": FLAGS.speculative_tokens, "speculative_method": FLAGS.speculative_method,
            "draft_model": FLAGS.draft_model, "device_state_slots": FLAGS.device_state_slots,
            "host_capacity_bytes": FLAGS.host_capacity_bytes, "device_memory_bytes": FLAGS.device_memory_bytes,
            "device_memory_fraction": FLAGS.device_memory_fraction, "branch_points": FLAGS.branch_points,
            "media_cache_bytes": FLAGS.media_cache_bytes, "allowed_local_media_path": FLAGS.allowed_local_media_path,
            "allow_media_urls": FLAGS.allow_media_urls or None, "max_input_pixels": FLAGS.max_input_pixels,
            "max_input_frames": FLAGS.max_input_frames, "chat_template": FLAGS.chat_template}


MEDIA_SETTINGS = {"media_cache_bytes": "cache_bytes", "allowed_local_media_path": "allowed_local_media_path",
                  "allow_media_urls": "allow_remote_urls", "max_input_pixels": "max_input_pixels",
                  "max_input_frames": "max_input_frames"}  # engine setting -> MediaConfig field


def engine_config(model: str, **settings):
    """An EngineConfig of `engine_settings()`-style settings (None: the default)."""
    from ninfer_jax import ContextCacheConfig, EngineConfig
    from ninfer_jax.config import MediaConfig

    given = {k: v for k, v in settings.items() if v is not None}
    cache = ContextCacheConfig(**{k: given.pop(k) for k in ("device_state_slots", "host_capacity_bytes",
                                                             "branch_points") if k in given})
    media = MediaConfig(**{MEDIA_SETTINGS[k]: given.pop(k) for k in list(given) if k in MEDIA_SETTINGS})
    return EngineConfig(model=model, context_cache=cache, media=media, **given)


def engine_config_from_flags():
    """An EngineConfig from the engine flags; unset flags keep EngineConfig's defaults (ConfigError
    for a value out of range)."""
    return engine_config(FLAGS.model, **engine_settings())


def sampling_dict() -> dict:
    return {"temperature": FLAGS.temperature, "seed": FLAGS.seed, "max_tokens": FLAGS.max_tokens}


def sampling():
    """SamplingParams from the flags (RequestError for a bad value: the engine's own check)."""
    from ninfer_jax.engine.types import SamplingParams

    return SamplingParams(**sampling_dict())


def _parse_token_ids() -> list[int]:
    from ninfer_jax.errors import RequestError

    try:
        return [int(t) for t in FLAGS.token_ids.replace(" ", "").split(",") if t]
    except ValueError:
        raise RequestError(f"prompt: --token_ids must be comma-separated integers, got {FLAGS.token_ids!r}") from None


def prompt_arg():
    """The prompt as token ids (--token_ids) or text (--prompt)."""
    return _parse_token_ids() if FLAGS.token_ids is not None else FLAGS.prompt


def parse_messages(text: str | None, prompt: str) -> list[dict]:
    """--messages (a JSON list, or @FILE holding one), else one user message with --prompt."""
    if not text:
        return [{"role": "user", "content": prompt}]
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--messages is not valid JSON: {exc.msg}") from None
    if not isinstance(messages, list):
        raise ValueError("--messages must be a JSON list of messages")
    return messages


def chat_messages() -> list[dict]:
    """The chat messages of --messages / --prompt (UsageError for ones that cannot be read), with
    the --image files as image parts of the last user message."""
    try:
        messages = parse_messages(FLAGS.messages, FLAGS.prompt)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    images = image_files()
    if images:
        last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
        if last is None:
            raise UsageError("--image: there is no user message to attach it to (give --prompt or --messages)")
        content = last.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        last["content"] = parts + [{"type": "image", "image": data} for data in images]
    return messages


def image_files() -> list[bytes]:
    """The bytes of each --image file, in order (UsageError for one that cannot be read)."""
    out = []
    for path in FLAGS.image or ():
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as e:
            raise UsageError(f"--image {path}: {e.strerror or e}") from None
    return out


def stdin_turns():
    """chat: the user messages waiting on stdin, one per line, as a lazy iterator; None when
    stdin is a terminal (without --turns), empty or silent (then chat runs one turn)."""
    import itertools
    import select

    if sys.stdin is None or sys.stdin.closed:
        return None
    if FLAGS.turns is None:
        try:
            if sys.stdin.isatty() or not select.select([sys.stdin], [], [], 0.2)[0]:
                return None
        except (OSError, ValueError):
            return None
    first = sys.stdin.readline()
    if not first:
        return None
    lines = (line.rstrip("\r\n") for line in itertools.chain([first], sys.stdin))
    return itertools.islice((line for line in lines if line.strip()), FLAGS.turns)
