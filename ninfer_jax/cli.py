"""ninfer_jax's commands of the `ninfer` program: generate | chat | bench | trace | plan | lower | help.

Flags (ninfer_jax/cli_flags.py) are named like the Python API. Output goes to stdout, progress
to stderr. `ninfer --help` lists the commands, `ninfer COMMAND --help` a command's flags
(ninfer_jax/cli_help.py). The `ninfer` console script is the server's CLI (server/cli.py): these
commands plus `serve`, `generate|chat --server` and `bench serve`, which need the server and so
live above it (`Commands` is how it adds them; `python -m ninfer_jax.cli` runs these alone).

Exit status: 0 done; 2 a usage error, refused before any model loads or compiles (bad flags,
sampling values, token ids, a prompt the model cannot take, a missing checkpoint: one line
`ninfer COMMAND: ErrorClass: message` on stderr, from engine/preflight.py, which applies the
engine's own rules); 1 an error once the engine runs. `ninfer plan` exits 1 when the capacity
plan cannot fit (its ConfigError), 2 for bad flags or a bad model folder. `ninfer lower` exits 1
when a step does not lower (the first failing step named), 2 for bad flags, a bad model folder or
a capacity that cannot fit.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys
from typing import Callable, Mapping, Sequence

from absl import app, flags

from ninfer_jax import bench, cli_help
from ninfer_jax.cli_flags import (UsageError, chat_messages, engine_config_from_flags, image_files, prompt_arg,
                                  sampling, stdin_turns)

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Commands:
    """The commands of one `ninfer` program: each one's handler (its positional arguments in,
    the exit status out) and help, and the benchmarks `ninfer bench` runs (name: module).
    `ENGINE` holds ninfer_jax's own; server/cli.py builds the whole program's from it."""

    handlers: Mapping[str, Callable[[list[str]], int]]
    help: Mapping[str, cli_help.Command]
    benches: Mapping[str, str]

    def named_in(self, argv: Sequence[str]) -> str | None:
        """The command an argv names (its first word that is one), or None."""
        return next((a for a in argv[1:] if a in self.handlers or a == "help"), None)


def usage_errors() -> tuple[type[BaseException], ...]:
    """What preflight and the CLI's own checks raise for bad input: exit 2, one line."""
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend.errors import FrontendError

    return NInferError, FrontendError, UsageError


def _say_error(command: str, exc: BaseException) -> None:
    text = " ".join(str(exc).split())  # one line, whatever the message holds
    print(f"ninfer {command}: {type(exc).__name__}: {text}", file=sys.stderr)


def refuse(command: str, exc: BaseException) -> int:
    """A usage error: one line on stderr, exit 2, nothing loaded."""
    _say_error(command, exc)
    return 2


def failed(command: str, exc: BaseException) -> int:
    """An error once the engine runs: one line on stderr, exit 1."""
    _say_error(command, exc)
    return 1


def no_arguments(command: str, args: list[str]) -> None:
    if args:
        hint = " (the prompt goes in --prompt)" if command in ("generate", "chat") else ""
        raise UsageError(f"unexpected argument {args[0]!r}{hint}; ninfer {command} --help lists its flags")


def _print_figures(figures: dict) -> None:
    if FLAGS.json:
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


def enable_compilation_cache() -> None:
    """JAX's persistent compilation cache (--compilation_cache), before any JAX work; a folder
    that cannot be used is a ConfigError (a usage error)."""
    from ninfer_jax.compile_cache import enable

    enable(FLAGS.compilation_cache)


def cmd_bench(args: list[str], benches: Mapping[str, str] | None = None, extra: Sequence[str] = ()) -> int:
    """Run one of `benches` (default: ninfer_jax's); `extra`: arguments the caller's own flags
    pass on to it, after those of --quick and --program."""
    benches = bench.BENCHES if benches is None else benches
    if not args:
        print(f"usage: ninfer bench {{{'|'.join(sorted(benches))}}} [--json]   (ninfer bench --help lists "
              "them)", file=sys.stderr)
        return 2
    try:
        module = bench.load(args[0], benches)
    except KeyError as e:
        print(f"ninfer bench: {e.args[0]}", file=sys.stderr)
        return 2
    args = args[1:]
    if FLAGS.quick:  # bench preempt reads these; its own flags go after `--`
        args.append("--quick")
    if FLAGS["program"].present:
        args.append(f"--program={FLAGS.program}")
    args.extend(extra)
    try:
        enable_compilation_cache()
    except usage_errors() as e:
        return refuse("bench", e)
    figures = module.run(args)
    if not FLAGS.json and hasattr(module, "text"):
        print(module.text(figures))
        return 0
    _print_figures(figures)
    return 0


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


def _chat_conversation(engine, messages: list[dict], turns, sampling_params) -> int:
    """A multi-turn chat: each line a user message, the reply (parsed, as a client would send it
    back) joins the history; per turn, prompt and cached tokens on stderr."""
    import os

    from ninfer_jax.bench.trace import assistant_message

    session = FLAGS.session or f"cli-{os.getpid()}"
    history = list(messages)
    for turn, text in enumerate(turns, 1):
        history.append({"role": "user", "content": text})
        handle = engine.submit_chat(history, session=session, sampling=sampling_params)
        code = _stream_completion(engine, handle, f"turn {turn}")
        if code:
            return code
        history.append(assistant_message(engine.tokenizer, handle.result().token_ids))
    return 0


def cmd_chat(args: list[str]) -> int:
    """One chat turn (--messages JSON or --prompt as the user message) on an in-process engine;
    a conversation with --turns N or user messages on stdin."""
    try:
        no_arguments("chat", args)
        messages = chat_messages()
        sampling_params = sampling()
        from ninfer_jax.engine.preflight import preflight

        config = engine_config_from_flags()
        # With --turns the history starts from --messages (or nothing): --prompt is not sent.
        first = messages if FLAGS.messages or FLAGS.turns is None else []
        preflight(config, messages=first, sampling=sampling_params)
        enable_compilation_cache()
    except usage_errors() as e:
        return refuse("chat", e)
    turns = stdin_turns()
    from ninfer_jax import Engine
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend.errors import FrontendError

    try:
        with Engine(config) as engine:
            if turns is not None:
                return _chat_conversation(engine, messages if FLAGS.messages else [], turns, sampling_params)
            handle = engine.submit_chat(messages, session=FLAGS.session, sampling=sampling_params)
            return _stream_completion(engine, handle, "chat")
    except (NInferError, FrontendError) as e:
        return failed("chat", e)


def cmd_generate(args: list[str]) -> int:
    """Generate from one prompt on an in-process engine; text to stdout as it streams."""
    try:
        no_arguments("generate", args)
        sampling_params = sampling()
        prompt = prompt_arg()
        images = image_files()
        from ninfer_jax.engine.preflight import preflight

        config = engine_config_from_flags()
        preflight(config, prompt=prompt, sampling=sampling_params, images=images)
        enable_compilation_cache()
    except usage_errors() as e:
        return refuse("generate", e)
    from ninfer_jax import Engine
    from ninfer_jax.errors import NInferError
    from ninfer_jax.frontend.errors import FrontendError

    try:
        with Engine(config) as engine:
            handle = engine.submit(prompt, sampling_params, images=images)
            return _stream_completion(engine, handle, "generate")
    except (NInferError, FrontendError) as e:
        return failed("generate", e)


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
    cache = {"cache_device_bytes": FLAGS.cache_device_bytes, "split": FLAGS.split, "split_sweep": FLAGS.split_sweep}
    try:
        from ninfer_jax.bench.trace import cache_budgets, check_cache_flags, load_trace
        from ninfer_jax.engine.preflight import model_config, preflight

        config = engine_config_from_flags()
        sampling()
        # The cache byte budget flags (docs/trace.md): checked before anything loads or replays.
        check_cache_flags(FLAGS.program, config, **cache)
        if FLAGS.program == "sim":  # the cost-model Program: the built-in sizes, or the folder's config.json
            from ninfer_jax.sim.program import CostModel

            model = model_config(config.model)
            if FLAGS.cache_device_bytes is None:
                preflight(config, model=model)
            if FLAGS.cost:
                CostModel.load(FLAGS.cost)  # a bad cost file is refused before the replay
        else:
            if FLAGS.cost:
                from ninfer_jax.errors import ConfigError

                raise ConfigError("cost", "sets the cost-model Program's costs: it needs --program=sim")
            preflight(config)
        if FLAGS.cache_device_bytes is not None:  # every split sized (and refused) before the first replay
            try:
                source = load_trace(args[0], FLAGS.trace_format)
            except TraceError as e:
                print(f"ninfer trace: {e}", file=sys.stderr)
                return 2
            if FLAGS.trace_limit:
                n = FLAGS.trace_limit
                source = dataclasses.replace(source, requests=source.requests[:n],
                                             output_tokens=source.output_tokens[:n])
            cache_budgets(source, config, cache_device_bytes=FLAGS.cache_device_bytes, split=FLAGS.split,
                          split_sweep=FLAGS.split_sweep, skip_too_long=FLAGS.skip_too_long,
                          max_context=FLAGS.max_context, default_max_tokens=FLAGS.max_tokens)
        enable_compilation_cache()
    except usage_errors() as e:
        return refuse("trace", e)
    try:
        figures = run_trace(source, config, program=FLAGS.program, fmt=FLAGS.trace_format,
                            cold=FLAGS.cold, limit=None if not isinstance(source, str) else FLAGS.trace_limit,
                            temperature=FLAGS.temperature, seed=FLAGS.seed, default_max_tokens=FLAGS.max_tokens,
                            report=FLAGS.report, skip_too_long=FLAGS.skip_too_long,
                            max_context=FLAGS.max_context, name=args[0],
                            **{k: v for k, v in cache.items() if v is not None},
                            **({"cost": FLAGS.cost} if FLAGS.cost else {}))
    except TraceError as e:
        print(f"ninfer trace: {e}", file=sys.stderr)
        return 2
    except (NInferError, FrontendError) as e:
        return failed("trace", e)
    _print_figures(figures)
    return 0


def cmd_plan(args: list[str]) -> int:
    """Print the capacity plan of the engine flags on --model (ninfer_jax/plan/): read from the
    model's config.json only, no weights loaded, nothing compiled. Exit 1 when it cannot fit."""
    try:
        no_arguments("plan", args)
        from ninfer_jax.engine.preflight import itemsize, model_config

        config = engine_config_from_flags()
        model = model_config(config.model)  # config.json only: a folder needs no weights here
        size = itemsize(config)
        from ninfer_jax.errors import ConfigError
        from ninfer_jax.plan import check_cache_device_bytes, check_split

        if FLAGS.split is not None:
            check_split(FLAGS.split)
            if FLAGS.cache_device_bytes is None:
                raise ConfigError("split", "is the StateImage share of --cache_device_bytes: give "
                                           "--cache_device_bytes=N too")
        if FLAGS.cache_device_bytes is not None:
            check_cache_device_bytes(FLAGS.cache_device_bytes)
    except usage_errors() as e:
        return refuse("plan", e)
    from ninfer_jax.plan import plan_capacity, with_cache_bytes

    try:
        plan = plan_capacity(config, model, size)
    except ConfigError as e:  # CFG-2, CFG-6: the config does not fit the device
        return failed("plan", e)
    if FLAGS.cache_device_bytes is not None:
        try:  # N split as ninfer trace --cache_device_bytes would; a budget it cannot split is a usage error
            plan = with_cache_bytes(plan, model, FLAGS.cache_device_bytes, FLAGS.split,
                                    max_context_given=FLAGS["max_context"].present)
        except ConfigError as e:
            return refuse("plan", e)
    print(json.dumps(plan.as_dict(), sort_keys=True) if FLAGS.json else plan.text())
    return 0


def cmd_lower(args: list[str]) -> int:
    """Lower every compiled step and Pallas kernel of --model for --platform from shapes alone
    (ninfer_jax/lower.py): config.json only, no weights, no device, nothing compiled. One line per
    step on stdout (or one JSON object); exit 1 naming the first step that did not lower."""
    try:
        no_arguments("lower", args)
        from ninfer_jax import lower

        plan = lower.plan_lowering(engine_config_from_flags(), platform=FLAGS.platform, backend=FLAGS.backend,
                                   speculative_tokens=FLAGS.speculative_tokens, only=FLAGS.steps)
    except usage_errors() as e:
        return refuse("lower", e)
    error = lower.run(plan, as_json=FLAGS.json)
    return failed("lower", error) if error else 0


ENGINE = Commands(
    handlers={"generate": cmd_generate, "chat": cmd_chat, "bench": cmd_bench, "trace": cmd_trace, "plan": cmd_plan,
              "lower": cmd_lower},
    help=cli_help.COMMANDS, benches=bench.BENCHES)


def main(argv: list[str], commands: Commands = ENGINE) -> int:
    """Dispatch after absl parsed the flags: argv is [program, COMMAND, positional args...]."""
    if len(argv) < 2:
        print(cli_help.general_help(commands.help), file=sys.stderr)
        return 2
    command, rest = argv[1], argv[2:]
    if command == "help":
        code, text = cli_help.help_request(["help", *rest], commands.help, commands.benches)
        print(text, file=sys.stdout if code == 0 else sys.stderr)
        return code
    if command not in commands.handlers:
        print(f"ninfer: unknown command {command!r}; ninfer --help lists the commands", file=sys.stderr)
        return 2
    return commands.handlers[command](rest)


def parse_flags(argv: list[str], commands: Commands = ENGINE) -> list[str]:
    """absl's flag parsing, with a bad flag reported as one line (exit 2) instead of absl's
    FATAL banner (exit 1)."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        command = commands.named_in(argv)
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


def run(argv: list[str] | None = None, commands: Commands = ENGINE) -> None:
    """The program: help before absl (which knows only its own --help), then the flags, then the
    command; exits with its status."""
    argv = list(sys.argv if argv is None else argv)
    quiet_routine_jax_logs()
    asked = cli_help.help_request(argv[1:], commands.help, commands.benches)
    if asked is not None:
        code, text = asked
        print(text, file=sys.stdout if code == 0 else sys.stderr)
        sys.exit(code)
    app.run(lambda args: sys.exit(main(args, commands)), argv=argv,
            flags_parser=lambda args: parse_flags(args, commands))


if __name__ == "__main__":
    run()
