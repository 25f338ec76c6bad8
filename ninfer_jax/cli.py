"""The `ninfer` command: generate | chat | serve | bench | trace | plan | lower | help (absl flags).

Flags are named like the Python API. Output goes to stdout, progress to stderr. `ninfer --help`
lists the commands, `ninfer COMMAND --help` a command's flags (ninfer_jax/cli_help.py).

Exit status: 0 done; 2 a usage error, refused before any model loads or compiles (bad flags,
sampling values, token ids, a prompt the model cannot take, a missing checkpoint: one line
`ninfer COMMAND: ErrorClass: message` on stderr, from engine/preflight.py, which applies the
engine's own rules); 1 an error once the engine runs. `ninfer plan` exits 1 when the capacity
plan cannot fit (its ConfigError), 2 for bad flags or a bad model folder. `ninfer lower` exits 1
when a step does not lower (the first failing step named), 2 for bad flags, a bad model folder or
a capacity that cannot fit.
"""
from __future__ import annotations

import json
import logging
import sys

from absl import app, flags

from ninfer_jax import cli_help

FLAGS = flags.FLAGS

# Sampling and engine flags carry no absl bounds: SamplingParams and EngineConfig are the one
# rule, and their typed errors are what the CLI reports (exit 2, before the model loads).
_MODEL = flags.DEFINE_string("model", "builtin:tiny-hybrid", "Checkpoint folder (config.json, safetensors, "
                             "tokenizer.json) or builtin:tiny-hybrid.")
_DTYPE = flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16"],
                           "Parameter and activation dtype; auto: the checkpoint's own.")
_PROMPT = flags.DEFINE_string("prompt", "Hello", "Prompt text.")
_TOKEN_IDS = flags.DEFINE_string("token_ids", None, "Comma-separated prompt token ids (instead of --prompt).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 32, "Tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature in [0, 100]; 0 is greedy.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed in [0, 2**63).")
_JSON = flags.DEFINE_bool("json", False, "bench, trace, plan, lower: print one JSON object.")

# serve, and generate/chat --server (the logic lives in server/cli_commands.py).
_SERVER = flags.DEFINE_string("server", None, "generate/chat: HOST:PORT of a running `ninfer serve` to use "
                              "instead of an in-process engine.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "serve: address to bind (loopback unless you say otherwise).")
_PORT = flags.DEFINE_integer("port", 50051, "serve: gRPC port to bind (0 = any free port, -1 = no gRPC: HTTP "
                             "only).", lower_bound=-1, upper_bound=65535)
_HTTP = flags.DEFINE_boolean("http", False, "bench serve: also run the load through the OpenAI-compatible "
                             "HTTP API and report its ratios.")
_HTTP_PORT = flags.DEFINE_integer("http_port", None, "serve: also serve the OpenAI-compatible HTTP API on this "
                                  "port (0 = any free port), same host, token and limits.", lower_bound=0,
                                  upper_bound=65535)
_TOKEN = flags.DEFINE_string("token", None, "serve: bearer token required in metadata; generate/chat --server: "
                             "token to send. Default: $NINFER_TOKEN.")
_WAIT_S = flags.DEFINE_float("wait_s", 120.0, "generate/chat --server: seconds to wait for the server to become "
                             "SERVING", lower_bound=0.0)
_MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", None, "Engine: requests decoded together (C, 1..8).")
_MAX_CONTEXT = flags.DEFINE_integer("max_context", None, "Engine: longest prompt + generation, in tokens.")
_CHUNK_SIZE = flags.DEFINE_integer("chunk_size", None, "Engine: prefill chunk length in tokens.")
_KV_CAPACITY = flags.DEFINE_integer("kv_capacity", None, "Engine: Main KV capacity in tokens.")
_SPECULATIVE_TOKENS = flags.DEFINE_integer("speculative_tokens", None, "Engine: MTP draft tokens verified per "
                                           "decode step (0 = off, 1..4; the model needs an MTP head).")
_PAUSE_ROUTE = flags.DEFINE_enum("pause_route", None, ["auto", "snapshot", "replay"],
                                 "Engine: how a preempted request keeps its work (auto: the cost model "
                                 "compares copying to Host with recomputing).")
_DEVICE_STATE_SLOTS = flags.DEFINE_integer("device_state_slots", None, "Context cache: device StateImage slots "
                                           "beyond the C basic ones.")
_HOST_CAPACITY_BYTES = flags.DEFINE_integer("host_capacity_bytes", None, "Context cache: Host arena bytes.")
_DEVICE_MEMORY_BYTES = flags.DEFINE_integer("device_memory_bytes", None, "Engine: the device's memory in bytes, "
                                            "instead of asking the device (plan: a device with this many bytes).")
_DEVICE_MEMORY_FRACTION = flags.DEFINE_float("device_memory_fraction", None, "Engine: the share of the device's "
                                             "memory the capacity plan may fill, in (0, 1].")
_COMPILATION_CACHE = flags.DEFINE_string("compilation_cache", None, "Folder for JAX's persistent compilation cache "
                                         "(default: $NINFER_COMPILATION_CACHE, else ~/.cache/ninfer/jax); 'off' "
                                         "disables it")
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
_TRACE_FORMAT = flags.DEFINE_enum("trace_format", "auto", ["auto", "chat", "marconi", "mooncake"],
                                  "trace: chat-level, Marconi token-level or Mooncake hash-block JSONL (auto: by the first line).")
_COST = flags.DEFINE_string("cost", None, "trace --program=sim: a JSON file of the cost model's step and copy "
                             "costs (default: the model folder's cost.json, else the built-in figures).")
_REPORT = flags.DEFINE_string("report", None, "trace: write the figures as JSON, PNG plots (TTFT CDF, reuse by "
                               "turn, pool occupancy, pauses) and summary.md into this folder.")
_TRACE_LIMIT = flags.DEFINE_integer("trace_limit", None, "trace: replay only the first N requests.", lower_bound=1)
_COLD = flags.DEFINE_bool("cold", True, "trace: also replay with the context cache off (the TTFT baseline).")
_BRANCH_POINTS = flags.DEFINE_bool("branch_points", None, "Context cache: offer raw prompts a shared save point "
                                   "where they leave every recently seen prompt (default on).")
_CACHE_DEVICE_BYTES = flags.DEFINE_integer("cache_device_bytes", None, "trace --program=sim, plan: N device bytes "
                                           "shared by Main KV pages, StateImage slots and backend pools, instead of "
                                           "the device-memory solve (\"what if the cache had N bytes\").")
_SPLIT = flags.DEFINE_float("split", None, "trace, plan: the StateImage share of --cache_device_bytes, in (0, 1) "
                            "(default: one StateImage per max_context/4 of Main KV, 2C slots at least where Main "
                            "KV keeps one max_context).")
_SPLIT_SWEEP = flags.DEFINE_string("split_sweep", None, "trace: replay --cache_device_bytes at each of these "
                                   "comma-separated StateImage shares (or 'default'), report each and the best.")
_SKIP_TOO_LONG = flags.DEFINE_bool("skip_too_long", False, "trace: report the requests that cannot fit max_context "
                                   "(requests_too_long) and replay the rest, instead of refusing the replay; with "
                                   "--cache_device_bytes, max_context is bounded by what Main KV holds.")
_PLATFORM = flags.DEFINE_string("platform", "cuda", "lower: the platform to lower for: cuda, rocm or cpu (no device "
                                "of that kind is needed).")
_BACKEND = flags.DEFINE_string("backend", None, "lower: the kernels' backend: pallas (the Triton kernels), xla (their "
                               "pure-JAX references) or interpret.")
_STEPS = flags.DEFINE_string("steps", None, "lower: only the steps whose names start with one of these "
                             "comma-separated prefixes, or of these kinds (step, head, mover, kernel).")
_QUICK = flags.DEFINE_bool("quick", False, "bench preempt: the smallest run (the cost-model Program only, seconds).")

COMMANDS = tuple(cli_help.COMMANDS)


class UsageError(Exception):
    """A command line the CLI itself cannot read (not a request or config the engine refuses)."""


def _usage_errors() -> tuple[type[BaseException], ...]:
    """What preflight and the CLI's own checks raise for bad input: exit 2, one line."""
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend.errors import FrontendError

    return NInferError, FrontendError, UsageError


def _say_error(command: str, exc: BaseException) -> None:
    text = " ".join(str(exc).split())  # one line, whatever the message holds
    print(f"ninfer {command}: {type(exc).__name__}: {text}", file=sys.stderr)


def _refuse(command: str, exc: BaseException) -> int:
    """A usage error: one line on stderr, exit 2, nothing loaded."""
    _say_error(command, exc)
    return 2


def _failed(command: str, exc: BaseException) -> int:
    """An error once the engine runs: one line on stderr, exit 1."""
    _say_error(command, exc)
    return 1


def _no_arguments(command: str, args: list[str]) -> None:
    if args:
        hint = " (the prompt goes in --prompt)" if command in ("generate", "chat") else ""
        raise UsageError(f"unexpected argument {args[0]!r}{hint}; ninfer {command} --help lists its flags")


def _print_figures(figures: dict) -> None:
    if _JSON.value:
        print(json.dumps(figures, sort_keys=True))
        return
    if "sweep" in figures:  # ninfer trace --split_sweep: one row per split
        from ninfer_jax.bench.trace import sweep_text

        print(sweep_text(figures))
        return
    width = max((len(k) for k in figures), default=0)
    for key, value in figures.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        print(f"{key:<{width}}  {value}")


def _enable_compilation_cache() -> None:
    """JAX's persistent compilation cache (--compilation_cache), before any JAX work; a folder
    that cannot be used is a ConfigError (a usage error)."""
    from ninfer_jax.compile_cache import enable

    enable(_COMPILATION_CACHE.value)


def cmd_bench(args: list[str]) -> int:
    from ninfer_jax import bench

    if not args:
        print(f"usage: ninfer bench {{{'|'.join(sorted(bench.BENCHES))}}} [--json]   (ninfer bench --help lists "
              "them)", file=sys.stderr)
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
    if _HTTP.value:  # bench serve: also through the HTTP API
        args.append("--http")
    try:
        _enable_compilation_cache()
    except _usage_errors() as e:
        return _refuse("bench", e)
    figures = module.run(args)
    if not _JSON.value and hasattr(module, "text"):
        print(module.text(figures))
        return 0
    _print_figures(figures)
    return 0


def _parse_token_ids() -> list[int]:
    from ninfer_jax.errors import RequestError

    try:
        return [int(t) for t in _TOKEN_IDS.value.replace(" ", "").split(",") if t]
    except ValueError:
        raise RequestError(f"prompt: --token_ids must be comma-separated integers, got {_TOKEN_IDS.value!r}") from None


def _prompt_arg():
    """The prompt as token ids (--token_ids) or text (--prompt)."""
    return _parse_token_ids() if _TOKEN_IDS.value is not None else _PROMPT.value


def _engine_settings() -> dict:
    return {"dtype": _DTYPE.value, "max_concurrency": _MAX_CONCURRENCY.value,
            "max_context": _MAX_CONTEXT.value, "chunk_size": _CHUNK_SIZE.value, "kv_capacity": _KV_CAPACITY.value,
            "pause_route": _PAUSE_ROUTE.value, "speculative_tokens": _SPECULATIVE_TOKENS.value,
            "device_state_slots": _DEVICE_STATE_SLOTS.value,
            "host_capacity_bytes": _HOST_CAPACITY_BYTES.value, "device_memory_bytes": _DEVICE_MEMORY_BYTES.value,
            "device_memory_fraction": _DEVICE_MEMORY_FRACTION.value, "branch_points": _BRANCH_POINTS.value}


def engine_config_from_flags():
    """An EngineConfig from the engine flags; unset flags keep EngineConfig's defaults (ConfigError
    for a value out of range)."""
    from ninfer_jax import ContextCacheConfig, EngineConfig

    given = _engine_settings()
    branch = given.pop("branch_points")
    cache = ContextCacheConfig(device_state_slots=given.pop("device_state_slots"),
                               host_capacity_bytes=given.pop("host_capacity_bytes"),
                               **({} if branch is None else {"branch_points": branch}))
    return EngineConfig(model=_MODEL.value, context_cache=cache, **{k: v for k, v in given.items() if v is not None})


def _sampling_dict() -> dict:
    return {"temperature": _TEMPERATURE.value, "seed": _SEED.value, "max_tokens": _MAX_TOKENS.value}


def _sampling():
    """SamplingParams from the flags (RequestError for a bad value: the engine's own check)."""
    from ninfer_jax.engine.types import SamplingParams

    return SamplingParams(**_sampling_dict())


def cmd_serve(args: list[str]) -> int:
    """Run the gRPC service (and with --http_port the OpenAI-compatible HTTP API) until SIGTERM/SIGINT
    (server/cli_commands.py)."""
    fake = _MODEL.value.startswith("fake:")  # server.testing's fake engine: no model, no JAX work
    try:
        _no_arguments("serve", args)
        if not fake:
            from ninfer_jax.engine.preflight import preflight

            preflight(engine_config_from_flags())
            _enable_compilation_cache()
    except _usage_errors() as e:
        return _refuse("serve", e)
    from server.cli_commands import serve

    if _PORT.value < 0 and _HTTP_PORT.value is None:
        return _refuse("serve", ValueError("--port=-1 turns gRPC off; give --http_port=PORT to serve HTTP instead"))
    return serve(model=_MODEL.value, host=_HOST.value, port=None if _PORT.value < 0 else _PORT.value,
                 http_port=_HTTP_PORT.value, token=_TOKEN.value, grace_s=_GRACE_S.value,
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


def _chat_conversation(engine, messages: list[dict], turns, sampling) -> int:
    """A multi-turn chat: each line a user message, the reply (parsed, as a client would send it
    back) joins the history; per turn, prompt and cached tokens on stderr."""
    import os

    from ninfer_jax.bench.trace import assistant_message

    session = _SESSION.value or f"cli-{os.getpid()}"
    history = list(messages)
    for turn, text in enumerate(turns, 1):
        history.append({"role": "user", "content": text})
        handle = engine.submit_chat(history, session=session, sampling=sampling)
        code = _stream_completion(engine, handle, f"turn {turn}")
        if code:
            return code
        history.append(assistant_message(engine.tokenizer, handle.result().token_ids))
    return 0


def cmd_chat(args: list[str]) -> int:
    """One chat turn (--messages JSON or --prompt as the user message), in process or --server;
    a conversation with --turns N or user messages on stdin."""
    from server.cli_commands import parse_messages

    try:
        _no_arguments("chat", args)
        try:
            messages = parse_messages(_MESSAGES.value, _PROMPT.value)
        except (ValueError, OSError) as e:
            raise UsageError(str(e)) from None
        sampling = _sampling()
        if not _SERVER.value:
            from ninfer_jax.engine.preflight import preflight

            config = engine_config_from_flags()
            # With --turns the history starts from --messages (or nothing): --prompt is not sent.
            first = messages if _MESSAGES.value or _TURNS.value is None else []
            preflight(config, messages=first, sampling=sampling)
            _enable_compilation_cache()
    except _usage_errors() as e:
        return _refuse("chat", e)
    turns = _stdin_turns()
    if _SERVER.value:
        from server.cli_commands import chat_remote

        try:
            history = messages if turns is None or _MESSAGES.value else []  # as in process: --prompt is not a turn
            return chat_remote(_SERVER.value, history, _sampling_dict(), session=_SESSION.value, token=_TOKEN.value,
                               timeout=_TIMEOUT.value, wait_s=_WAIT_S.value, turns=turns)
        except _usage_errors() as e:
            return _refuse("chat", e)
    from ninfer_jax import Engine
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend.errors import FrontendError

    try:
        with Engine(config) as engine:
            if turns is not None:
                return _chat_conversation(engine, messages if _MESSAGES.value else [], turns, sampling)
            handle = engine.submit_chat(messages, session=_SESSION.value, sampling=sampling)
            return _stream_completion(engine, handle, "chat")
    except (NInferError, FrontendError) as e:
        return _failed("chat", e)


def cmd_generate(args: list[str]) -> int:
    """Generate from one prompt on an in-process engine (or --server); text to stdout as it streams."""
    try:
        _no_arguments("generate", args)
        sampling = _sampling()
        prompt = _prompt_arg()
        if not _SERVER.value:
            from ninfer_jax.engine.preflight import preflight

            config = engine_config_from_flags()
            preflight(config, prompt=prompt, sampling=sampling)
            _enable_compilation_cache()
    except _usage_errors() as e:
        return _refuse("generate", e)
    if _SERVER.value:
        from server.cli_commands import generate_remote

        try:
            return generate_remote(_SERVER.value, prompt, _sampling_dict(), token=_TOKEN.value,
                                   timeout=_TIMEOUT.value, wait_s=_WAIT_S.value)
        except _usage_errors() as e:
            return _refuse("generate", e)
    from ninfer_jax import Engine
    from ninfer_jax.errors import NInferError

    try:
        with Engine(config) as engine:
            handle = engine.submit(prompt, sampling)
            return _stream_completion(engine, handle, "generate")
    except NInferError as e:
        return _failed("generate", e)


def cmd_trace(args: list[str]) -> int:
    """Replay a chat-level or Marconi token-level JSONL trace, cache on and off (docs/trace.md)."""
    from ninfer_jax.bench.trace import TraceError, run_trace
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend import FrontendError

    if len(args) != 1:
        print("usage: ninfer trace FILE [--program=model|sim] [--trace_format=auto|chat|marconi|mooncake] [--json]"
              "   (ninfer trace --help lists its flags)", file=sys.stderr)
        return 2
    source = args[0]
    cache = {"cache_device_bytes": _CACHE_DEVICE_BYTES.value, "split": _SPLIT.value, "split_sweep": _SPLIT_SWEEP.value}
    try:
        from ninfer_jax.bench.trace import cache_budgets, check_cache_flags, load_trace
        from ninfer_jax.engine.preflight import model_config, preflight

        config = engine_config_from_flags()
        _sampling()
        # The cache byte budget flags (docs/trace.md): checked before anything loads or replays.
        check_cache_flags(_PROGRAM.value, config, **cache)
        if _PROGRAM.value == "sim":  # the cost-model Program: the built-in sizes, or the folder's config.json
            from ninfer_jax.sim.program import CostModel

            model = model_config(config.model)
            if _CACHE_DEVICE_BYTES.value is None:
                preflight(config, model=model)
            if _COST.value:
                CostModel.load(_COST.value)  # a bad cost file is refused before the replay
        else:
            if _COST.value:
                from ninfer_jax.errors import ConfigError

                raise ConfigError("cost", "sets the cost-model Program's costs: it needs --program=sim")
            preflight(config)
        if _CACHE_DEVICE_BYTES.value is not None:  # every split sized (and refused) before the first replay
            try:
                source = load_trace(args[0], _TRACE_FORMAT.value)
            except TraceError as e:
                print(f"ninfer trace: {e}", file=sys.stderr)
                return 2
            if _TRACE_LIMIT.value:
                import dataclasses

                n = _TRACE_LIMIT.value
                source = dataclasses.replace(source, requests=source.requests[:n],
                                             output_tokens=source.output_tokens[:n])
            cache_budgets(source, config, cache_device_bytes=_CACHE_DEVICE_BYTES.value, split=_SPLIT.value,
                          split_sweep=_SPLIT_SWEEP.value, skip_too_long=_SKIP_TOO_LONG.value,
                          max_context=_MAX_CONTEXT.value, default_max_tokens=_MAX_TOKENS.value)
        _enable_compilation_cache()
    except _usage_errors() as e:
        return _refuse("trace", e)
    try:
        figures = run_trace(source, config, program=_PROGRAM.value, fmt=_TRACE_FORMAT.value,
                            cold=_COLD.value, limit=None if not isinstance(source, str) else _TRACE_LIMIT.value,
                            temperature=_TEMPERATURE.value, seed=_SEED.value, default_max_tokens=_MAX_TOKENS.value,
                            report=_REPORT.value, skip_too_long=_SKIP_TOO_LONG.value,
                            max_context=_MAX_CONTEXT.value, name=args[0],
                            **{k: v for k, v in cache.items() if v is not None},
                            **({"cost": _COST.value} if _COST.value else {}))
    except TraceError as e:
        print(f"ninfer trace: {e}", file=sys.stderr)
        return 2
    except (NInferError, FrontendError) as e:
        return _failed("trace", e)
    _print_figures(figures)
    return 0


def cmd_plan(args: list[str]) -> int:
    """Print the capacity plan of the engine flags on --model (ninfer_jax/plan.py): read from the
    model's config.json only, no weights loaded, nothing compiled. Exit 1 when it cannot fit."""
    try:
        _no_arguments("plan", args)
        from ninfer_jax.engine.preflight import itemsize, model_config

        config = engine_config_from_flags()
        model = model_config(config.model)  # config.json only: a folder needs no weights here
        size = itemsize(config)
        from ninfer_jax.errors import ConfigError
        from ninfer_jax.plan import check_cache_device_bytes, check_split

        if _SPLIT.value is not None:
            check_split(_SPLIT.value)
            if _CACHE_DEVICE_BYTES.value is None:
                raise ConfigError("split", "is the StateImage share of --cache_device_bytes: give "
                                           "--cache_device_bytes=N too")
        if _CACHE_DEVICE_BYTES.value is not None:
            check_cache_device_bytes(_CACHE_DEVICE_BYTES.value)
    except _usage_errors() as e:
        return _refuse("plan", e)
    from ninfer_jax.plan import plan_capacity, with_cache_bytes

    try:
        plan = plan_capacity(config, model, size)
    except ConfigError as e:  # CFG-2, CFG-6: the config does not fit the device
        return _failed("plan", e)
    if _CACHE_DEVICE_BYTES.value is not None:
        try:  # N split as ninfer trace --cache_device_bytes would; a budget it cannot split is a usage error
            plan = with_cache_bytes(plan, model, _CACHE_DEVICE_BYTES.value, _SPLIT.value,
                                    max_context_given=FLAGS["max_context"].present)
        except ConfigError as e:
            return _refuse("plan", e)
    print(json.dumps(plan.as_dict(), sort_keys=True) if _JSON.value else plan.text())
    return 0


def cmd_lower(args: list[str]) -> int:
    """Lower every compiled step and Pallas kernel of --model for --platform from shapes alone
    (ninfer_jax/lower.py): config.json only, no weights, no device, nothing compiled. One line per
    step on stdout (or one JSON object); exit 1 naming the first step that did not lower."""
    try:
        _no_arguments("lower", args)
        from ninfer_jax import lower

        plan = lower.plan_lowering(engine_config_from_flags(), platform=_PLATFORM.value, backend=_BACKEND.value,
                                   speculative_tokens=_SPECULATIVE_TOKENS.value, only=_STEPS.value)
    except _usage_errors() as e:
        return _refuse("lower", e)
    error = lower.run(plan, as_json=_JSON.value)
    return _failed("lower", error) if error else 0


def cmd_help(args: list[str]) -> int:
    code, text = cli_help.help_request(["help", *args])
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


HANDLERS = {"generate": cmd_generate, "chat": cmd_chat, "serve": cmd_serve, "bench": cmd_bench, "trace": cmd_trace,
            "plan": cmd_plan, "lower": cmd_lower, "help": cmd_help}


def main(argv: list[str]) -> int:
    """Dispatch after absl parsed the flags: argv is [program, COMMAND, positional args...]."""
    if len(argv) < 2:
        print(cli_help.general_help(), file=sys.stderr)
        return 2
    command, rest = argv[1], argv[2:]
    if command not in HANDLERS:
        print(f"ninfer: unknown command {command!r}; ninfer --help lists the commands", file=sys.stderr)
        return 2
    return HANDLERS[command](rest)


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv[1:] if a in HANDLERS), None)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a bad flag reported as one line (exit 2) instead of absl's
    FATAL banner (exit 1)."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        command = _command_of(argv)
        where = f"ninfer {command}" if command else "ninfer"
        print(f"{where}: {type(e).__name__}: {' '.join(str(e).split())} ({where} --help lists the flags)",
              file=sys.stderr)
        sys.exit(2)


# INFO lines JAX logs on every run, which absl's default verbosity (INFO) would print on every
# command: the probe of a platform that is not there, and the compilation cache being (re)opened.
_ROUTINE_JAX_LINES = {
    "jax._src.xla_bridge": ("Unable to initialize backend 'tpu'",),
    "jax._src.compilation_cache": ("Resetting cache at",),
}


class _DropRoutine(logging.Filter):
    """Drops the routine INFO lines above; warnings, errors and every other line still show."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.getMessage().startswith(self.prefixes)


def quiet_routine_jax_logs() -> None:
    """Install the filters on JAX's loggers (before JAX initialises its backends); idempotent."""
    for name, prefixes in _ROUTINE_JAX_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRoutine) for f in logger.filters):
            logger.addFilter(_DropRoutine(prefixes))


def run(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    quiet_routine_jax_logs()
    asked = cli_help.help_request(argv[1:])  # before absl, which knows only its own --help
    if asked is not None:
        code, text = asked
        print(text, file=sys.stdout if code == 0 else sys.stderr)
        sys.exit(code)
    app.run(lambda args: sys.exit(main(args)), argv=argv, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
