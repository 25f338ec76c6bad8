"""The `ninfer` command: generate | chat | serve | bench | trace (absl flags).

Flags are named like the Python API. Output goes to stdout, progress to stderr.
"""
from __future__ import annotations

import json
import sys

from absl import app, flags

FLAGS = flags.FLAGS

_MODEL = flags.DEFINE_string("model", "builtin:tiny-hybrid", "Checkpoint folder or builtin:tiny-hybrid.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter and activation dtype.")
_PROMPT = flags.DEFINE_string("prompt", "Hello", "Prompt text, or token ids when --token_ids is set.")
_TOKEN_IDS = flags.DEFINE_string("token_ids", None, "Comma-separated prompt token ids (instead of --prompt).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 32, "Tokens to generate.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 is greedy.", lower_bound=0.0)
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_JSON = flags.DEFINE_bool("json", False, "bench: print one JSON object.")

# serve, and generate/chat --server (the logic lives in server/cli_commands.py).
_SERVER = flags.DEFINE_string("server", None, "generate/chat: HOST:PORT of a running `ninfer serve` to use "
                              "instead of an in-process engine.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "serve: address to bind (loopback unless you say otherwise).")
_PORT = flags.DEFINE_integer("port", 50051, "serve: port to bind (0 = any free port).", lower_bound=0)
_TOKEN = flags.DEFINE_string("token", None, "serve: bearer token required in metadata; generate/chat --server: "
                             "token to send. Default: $NINFER_TOKEN.")
_MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", None, "Engine: requests decoded together.", lower_bound=1)
_MAX_CONTEXT = flags.DEFINE_integer("max_context", None, "Engine: longest prompt + generation.", lower_bound=1)
_CHUNK_SIZE = flags.DEFINE_integer("chunk_size", None, "Engine: prefill chunk length.", lower_bound=1)
_KV_CAPACITY = flags.DEFINE_integer("kv_capacity", None, "Engine: Main KV capacity in tokens.", lower_bound=1)
_PAUSE_ROUTE = flags.DEFINE_enum("pause_route", None, ["auto", "snapshot", "replay"],
                                 "Engine: how a preempted request keeps its work (default auto: the cost model "
                                 "compares copying to Host with recomputing).")
_DEVICE_STATE_SLOTS = flags.DEFINE_integer("device_state_slots", None, "Context cache: device StateImage slots.",
                                           lower_bound=0)
_HOST_CAPACITY_BYTES = flags.DEFINE_integer("host_capacity_bytes", None, "Context cache: Host arena bytes.",
                                            lower_bound=0)
_GRACE_S = flags.DEFINE_float("grace_s", 10.0, "serve: seconds running streams get to finish on SIGTERM/SIGINT.",
                              lower_bound=0.0)
_MAX_MESSAGE_BYTES = flags.DEFINE_integer("max_message_bytes", 8 << 20, "serve: largest gRPC message.",
                                          lower_bound=1024)
_MESSAGES = flags.DEFINE_string("messages", None, "chat: JSON list of messages, or @FILE (default: one user "
                                "message with --prompt).")
_SESSION = flags.DEFINE_string("session", None, "chat: session id.")
_TIMEOUT = flags.DEFINE_float("timeout", None, "generate/chat --server: deadline of the call in seconds.")
_TURNS = flags.DEFINE_integer("turns", None, "chat: a multi-turn conversation of up to N user messages read from "
                              "stdin, one per line (also without --turns when stdin holds lines).", lower_bound=1)
_PROGRAM = flags.DEFINE_enum("program", "model", ["model", "sim"], "trace: the real model or the cost-model Program; "
                              "bench preempt: run only this one (default both).")
_TRACE_FORMAT = flags.DEFINE_enum("trace_format", "auto", ["auto", "chat", "marconi"],
                                  "trace: chat-level or Marconi token-level JSONL (auto: by the first line).")
_TRACE_LIMIT = flags.DEFINE_integer("trace_limit", None, "trace: replay only the first N requests.", lower_bound=1)
_COLD = flags.DEFINE_bool("cold", True, "trace: also replay with the context cache off (the TTFT baseline).")
_QUICK = flags.DEFINE_bool("quick", False, "bench preempt: the smallest run (the cost-model Program only, seconds).")

COMMANDS = ("generate", "chat", "serve", "bench", "trace")


def _usage() -> str:
    return "usage: ninfer {" + "|".join(COMMANDS) + "} [flags]   (ninfer --helpfull lists the flags)"


def _print_figures(figures: dict) -> None:
    if _JSON.value:
        print(json.dumps(figures, sort_keys=True))
        return
    width = max((len(k) for k in figures), default=0)
    for key, value in figures.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        print(f"{key:<{width}}  {value}")


def cmd_bench(args: list[str]) -> int:
    from ninfer_jax import bench

    if not args:
        print(f"usage: ninfer bench {{{'|'.join(sorted(bench.BENCHES))}}} [--json]", file=sys.stderr)
        return 2
    try:
        module = bench.load(args[0])
    except KeyError as e:
        print(f"ninfer bench: {e.args[0]}", file=sys.stderr)
        return 2
    args = args[1:]
    if _QUICK.value:  # bench preempt reads these; its own flags go after `--`
        args.append("--quick")
    if FLAGS["program"].present:
        args.append(f"--program={_PROGRAM.value}")
    figures = module.run(args)
    if not _JSON.value and hasattr(module, "text"):
        print(module.text(figures))
        return 0
    _print_figures(figures)
    return 0


def _parse_token_ids() -> list[int]:
    try:
        return [int(t) for t in _TOKEN_IDS.value.replace(" ", "").split(",") if t]
    except ValueError:
        raise app.UsageError(f"--token_ids must be comma-separated integers, got {_TOKEN_IDS.value!r}") from None


def _prompt(engine):
    """The prompt as token ids (--token_ids) or text (--prompt)."""
    if _TOKEN_IDS.value is not None:
        return _parse_token_ids()
    if engine.tokenizer is None:
        raise app.UsageError(f"{_MODEL.value} ships no tokenizer.json: pass --token_ids")
    return _PROMPT.value


def engine_config_from_flags():
    """An EngineConfig from the engine flags; unset flags keep EngineConfig's defaults."""
    from ninfer_jax import ContextCacheConfig, EngineConfig

    given = {"model": _MODEL.value, "dtype": _DTYPE.value, "max_concurrency": _MAX_CONCURRENCY.value,
             "max_context": _MAX_CONTEXT.value, "chunk_size": _CHUNK_SIZE.value, "kv_capacity": _KV_CAPACITY.value,
             "pause_route": _PAUSE_ROUTE.value}
    cache = ContextCacheConfig(device_state_slots=_DEVICE_STATE_SLOTS.value,
                               host_capacity_bytes=_HOST_CAPACITY_BYTES.value)
    return EngineConfig(context_cache=cache, **{k: v for k, v in given.items() if v is not None})


def _sampling_dict() -> dict:
    return {"temperature": _TEMPERATURE.value, "seed": _SEED.value, "max_tokens": _MAX_TOKENS.value}


def _engine_settings() -> dict:
    return {"dtype": _DTYPE.value, "max_concurrency": _MAX_CONCURRENCY.value, "max_context": _MAX_CONTEXT.value,
            "chunk_size": _CHUNK_SIZE.value, "kv_capacity": _KV_CAPACITY.value, "pause_route": _PAUSE_ROUTE.value,
            "device_state_slots": _DEVICE_STATE_SLOTS.value, "host_capacity_bytes": _HOST_CAPACITY_BYTES.value}


def cmd_serve(args: list[str]) -> int:
    """Run the gRPC service until SIGTERM/SIGINT (server/cli_commands.py)."""
    from server.cli_commands import serve

    return serve(model=_MODEL.value, host=_HOST.value, port=_PORT.value, token=_TOKEN.value, grace_s=_GRACE_S.value,
                 max_message_bytes=_MAX_MESSAGE_BYTES.value, **_engine_settings())


def _stream_completion(engine, handle, what: str) -> int:
    import time

    start = time.perf_counter()
    for delta in handle.stream():
        if engine.tokenizer is None:
            print(" ".join(map(str, delta.token_ids)), end=" ", flush=True)
        else:
            print(delta.text, end="", flush=True)
    print()
    r = handle.result()
    print(f"[ninfer] {what}: {r.usage.prompt_tokens} prompt tokens ({r.usage.cached_tokens} cached), "
          f"{r.usage.completion_tokens} generated in {time.perf_counter() - start:.2f}s ({r.finish_reason})"
          + (f": {r.error}" if r.error else ""), file=sys.stderr)
    return 0 if r.finish_reason != "error" else 1


def _stdin_turns():
    """chat: the user messages waiting on stdin, one per line, as a lazy iterator; None when
    stdin is a terminal (without --turns), empty or silent (then chat runs one turn)."""
    import itertools
    import select

    if sys.stdin is None or sys.stdin.closed:
        return None
    if _TURNS.value is None:
        try:
            if sys.stdin.isatty() or not select.select([sys.stdin], [], [], 0.2)[0]:
                return None
        except (OSError, ValueError):
            return None
    first = sys.stdin.readline()
    if not first:
        return None
    lines = (line.rstrip("\r\n") for line in itertools.chain([first], sys.stdin))
    return itertools.islice((line for line in lines if line.strip()), _TURNS.value)


def _chat_conversation(engine, messages: list[dict], turns) -> int:
    """A multi-turn chat: each line a user message, the reply (parsed, as a client would send it
    back) joins the history; per turn, prompt and cached tokens on stderr."""
    import os

    from ninfer_jax import SamplingParams
    from ninfer_jax.bench.trace import assistant_message

    session = _SESSION.value or f"cli-{os.getpid()}"
    history = list(messages)
    for turn, text in enumerate(turns, 1):
        history.append({"role": "user", "content": text})
        handle = engine.submit_chat(history, session=session, sampling=SamplingParams(**_sampling_dict()))
        code = _stream_completion(engine, handle, f"turn {turn}")
        if code:
            return code
        history.append(assistant_message(engine.tokenizer, handle.result().token_ids))
    return 0


def cmd_chat(args: list[str]) -> int:
    """One chat turn (--messages JSON or --prompt as the user message), in process or --server;
    a conversation with --turns N or user messages on stdin (in process)."""
    from server.cli_commands import chat_remote, parse_messages

    try:
        messages = parse_messages(_MESSAGES.value, _PROMPT.value)
    except (ValueError, OSError) as e:
        print(f"ninfer chat: {e}", file=sys.stderr)
        return 2
    if _SERVER.value:
        return chat_remote(_SERVER.value, messages, _sampling_dict(), session=_SESSION.value, token=_TOKEN.value,
                           timeout=_TIMEOUT.value)
    from ninfer_jax import Engine, SamplingParams
    from ninfer_jax.errors import NInferError

    turns = _stdin_turns()
    try:
        with Engine(engine_config_from_flags()) as engine:
            if turns is not None:
                return _chat_conversation(engine, messages if _MESSAGES.value else [], turns)
            handle = engine.submit_chat(messages, session=_SESSION.value, sampling=SamplingParams(**_sampling_dict()))
            return _stream_completion(engine, handle, "chat")
    except NInferError as e:
        print(f"ninfer chat: {e}", file=sys.stderr)
        return 1


def cmd_generate(args: list[str]) -> int:
    """Generate from one prompt on an in-process engine (or --server); text to stdout as it streams."""
    if _SERVER.value:
        from server.cli_commands import generate_remote

        prompt = _PROMPT.value if _TOKEN_IDS.value is None else _parse_token_ids()
        return generate_remote(_SERVER.value, prompt, _sampling_dict(), token=_TOKEN.value, timeout=_TIMEOUT.value)
    from ninfer_jax import Engine, SamplingParams
    from ninfer_jax.errors import NInferError

    try:
        with Engine(engine_config_from_flags()) as engine:
            handle = engine.submit(_prompt(engine), SamplingParams(**_sampling_dict()))
            return _stream_completion(engine, handle, "generate")
    except NInferError as e:
        print(f"ninfer generate: {e}", file=sys.stderr)
        return 1


def cmd_trace(args: list[str]) -> int:
    """Replay a chat-level or Marconi token-level JSONL trace, cache on and off (docs/trace.md)."""
    from ninfer_jax.bench.trace import TraceError, run_trace
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend import FrontendError

    if len(args) != 1:
        print("usage: ninfer trace FILE [--program=model|sim] [--trace_format=auto|chat|marconi] [--json]",
              file=sys.stderr)
        return 2
    try:
        figures = run_trace(args[0], engine_config_from_flags(), program=_PROGRAM.value, fmt=_TRACE_FORMAT.value,
                            cold=_COLD.value, limit=_TRACE_LIMIT.value, temperature=_TEMPERATURE.value,
                            seed=_SEED.value, default_max_tokens=_MAX_TOKENS.value)
    except TraceError as e:
        print(f"ninfer trace: {e}", file=sys.stderr)
        return 2
    except (NInferError, FrontendError) as e:
        print(f"ninfer trace: {e}", file=sys.stderr)
        return 1
    _print_figures(figures)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(_usage(), file=sys.stderr)
        return 2
    command, rest = argv[1], argv[2:]
    handlers = {"bench": cmd_bench, "generate": cmd_generate, "serve": cmd_serve, "chat": cmd_chat,
                "trace": cmd_trace}
    if command not in handlers:
        if command in COMMANDS:
            print(f"ninfer {command}: not available yet in this build", file=sys.stderr)
        else:
            print(f"ninfer: unknown command {command!r}\n{_usage()}", file=sys.stderr)
        return 2
    return handlers[command](rest)


def run() -> None:
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
