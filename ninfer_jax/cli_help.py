"""`ninfer --help`, `ninfer help [COMMAND]`, `ninfer COMMAND --help|-h`: the commands, and each
command's own flags with their defaults and examples (the flags are defined in ninfer_jax/cli_flags.py,
the server's in server/cli.py, which adds its commands' help to `COMMANDS` with `with_section`).

Engine flags whose flag default is None show the default EngineConfig / ContextCacheConfig
gives them, read from those dataclasses. absl's own flags appear only under `--helpfull`.
"""
from __future__ import annotations

import dataclasses
import re
import textwrap
from typing import Mapping

from absl import flags

FLAGS = flags.FLAGS

HELP_ARGS = ("--help", "-help", "-h", "--helpshort", "-helpshort", "-?")
HELPFULL_ARGS = ("--helpfull", "-helpfull")

SAMPLING = ("max_tokens", "temperature", "seed")
MODEL = ("model", "dtype")
ENGINE = ("max_concurrency", "max_context", "chunk_size", "kv_capacity", "pause_route", "speculative_tokens",
          "speculative_method", "draft_model", "device_state_slots", "host_capacity_bytes", "branch_points", "device_memory_bytes", "device_memory_fraction",
          "compilation_cache", "chat_template")
# Image and video input (a checkpoint with a vision tower).
MEDIA = ("media_cache_bytes", "allowed_local_media_path", "allow_media_urls", "max_input_pixels", "max_input_frames")
# What sizes the capacity plan (ninfer plan); the other engine flags are accepted and change nothing.
CAPACITY = ("max_concurrency", "max_context", "chunk_size", "kv_capacity", "device_state_slots",
            "host_capacity_bytes", "device_memory_bytes", "device_memory_fraction", "speculative_tokens",
            "speculative_method", "draft_model")

# The sizes `ninfer lower` lowers the Program's steps at (its capacity plan, as ninfer plan's).
LOWER_SIZES = ("max_concurrency", "max_context", "chunk_size", "kv_capacity", "device_state_slots",
               "device_memory_bytes", "device_memory_fraction")

# ninfer trace --program=sim: one byte budget for the pools instead of the device solve (docs/trace.md).
CACHE_BUDGET = ("cache_device_bytes", "split", "split_sweep", "skip_too_long")


@dataclasses.dataclass(frozen=True)
class Command:
    summary: str  # one line in `ninfer --help`
    usage: str
    about: str
    sections: tuple[tuple[str, tuple[str, ...]], ...]  # (title, flag names)
    examples: tuple[str, ...]


COMMANDS: dict[str, Command] = {
    "generate": Command(
        "generate from one prompt, text to stdout as it streams (in process, or --server)",
        "ninfer generate [--prompt=TEXT | --token_ids=1,2,3] [flags]",
        "Generates from one raw prompt on an in-process engine (or a running `ninfer serve` with "
        "--server). Text goes to stdout, progress and usage to stderr. Bad input is refused before "
        "the model loads (exit 2).",
        (("request", ("prompt", "token_ids", "image") + SAMPLING), ("model", MODEL), ("engine", ENGINE),
         ("media", MEDIA)),
        ('ninfer generate --prompt "Hello" --max_tokens 16',
         'ninfer generate --model=/path/to/qwen3.5-vl --image=shot.png --prompt "What is on the screen?"',
         "ninfer generate --model=/path/to/checkpoint --token_ids=1,2,3 --temperature 0.7 --seed 1",
         'ninfer generate --server=127.0.0.1:50051 --prompt "Hello"')),
    "chat": Command(
        "chat with the model's chat template: one turn, or a conversation read from stdin",
        "ninfer chat [--prompt=TEXT | --messages=JSON|@FILE] [--turns=N] [flags]",
        "Renders the messages with the model's chat template and streams the reply. With --turns N, "
        "or user messages piped on stdin (one per line), a multi-turn conversation; prompt and "
        "cached tokens per turn on stderr. Needs a model with a tokenizer.",
        (("request", ("prompt", "messages", "image", "session", "turns") + SAMPLING), ("model", MODEL),
         ("engine", ENGINE), ("media", MEDIA)),
        ('ninfer chat --prompt "Hi!" --max_tokens 16',
         "printf 'Hi!\\nAnd tomorrow?\\n' | ninfer chat --turns 2")),
    "bench": Command(
        "run a benchmark and print its figures (ninfer bench NAME [--json])",
        "ninfer bench NAME [--json] [-- BENCH_FLAGS]",
        "Runs one benchmark and prints its figures (aligned lines, or one JSON object with "
        "--json). A benchmark's own flags go after `--`.",
        (("bench", ("json", "quick", "program", "compilation_cache")),),
        ("ninfer bench engine --json", "ninfer bench preempt --quick")),
    "trace": Command(
        "replay a chat or Marconi JSONL trace with the context cache on and off",
        "ninfer trace FILE [--program=model|sim] [--trace_format=auto|chat|marconi|mooncake] [--json] [flags]",
        "Replays a trace (docs/trace.md) with the context cache on, and off with --cold: reuse "
        "against the offline bound, TTFT cached vs cold.",
        (("trace", ("program", "trace_format", "trace_limit", "cold", "json", "report", "cost") + SAMPLING),
         ("cache byte budget", CACHE_BUDGET), ("model", MODEL), ("engine", ENGINE)),
        ("python -m ninfer_jax.bench.trace_gen --kind agent --sessions 200 --out agent.jsonl",
         "ninfer trace agent.jsonl --program=sim",
         "ninfer trace marconi.jsonl --program=sim --model=ninfer_jax/sim/geometries/qwen3_next_80b_a3b "
         "--cache_device_bytes=17179869184 --split_sweep=0.1,0.25,0.5 --skip_too_long")),
    "plan": Command(
        "print the capacity plan: weights, Main KV, StateImages, workspace on the device (no weights loaded)",
        "ninfer plan [--model=FOLDER] [--dtype=...] [--max_concurrency=C] [--max_context=TOKENS] "
        "[--device_memory_bytes=N] [--cache_device_bytes=N [--split=S]] [--json]",
        "Prints what the engine would put on the device for these flags: the device's memory (asked of "
        "the device, or --device_memory_bytes: a device with N bytes) times --device_memory_fraction, "
        "the weights, the Main KV it solves (pages, tokens, bytes), the StateImage slots, backend pools, "
        "workspace, compiled-step space, the Host arena and what is left free. It reads the model's "
        "config.json only; no weights are loaded and nothing compiles. It also shows the default "
        "split of a cache byte budget between StateImage slots and Main KV (the one `ninfer trace "
        "--cache_device_bytes` uses without --split), and with --cache_device_bytes=N the pools N "
        "gives at --split (or that default). Exit 1, with the ConfigError, when the plan cannot fit; "
        "2 for bad flags.",
        (("plan", ("json", "cache_device_bytes", "split")), ("model", MODEL), ("capacity", CAPACITY)),
        ("ninfer plan --model=/path/to/Qwen3-Next-80B-A3B-Instruct --max_concurrency=8 --max_context=32768 "
         "--device_memory_bytes=206158430208",
         "ninfer plan --json                                # the built-in model on this device")),
    "lower": Command(
        "lower every compiled step and Pallas kernel for a GPU, without one (no weights read)",
        "ninfer lower [--platform=cuda|rocm|cpu] [--model=FOLDER] [--steps=PREFIX,...] [--json] [flags]",
        "Lowers, from shapes alone, every step the engine compiles — the prefill chunk, every decode "
        "bucket, the speculative steps of a model with an MTP head, the head an exact hit samples from, "
        "the pools' byte movers — and every Pallas kernel on its own at the model's shapes, for "
        "--platform (no device of that kind is needed: Triton's own compilation is not run). It reads "
        "the model's config.json only, so a folder holding just config.json works. One line per step "
        "on stdout: lowered, with the custom calls its StableHLO holds (__gpu$xla.gpu.triton for a "
        "Triton kernel) and the Pallas kernels by name, or FAILED with the error. Exit 1 naming the "
        "first step that did not lower; 2 for bad flags, a bad model folder or sizes that do not fit.",
        (("lower", ("platform", "backend", "steps", "speculative_tokens", "json")), ("model", MODEL),
         ("sizes", LOWER_SIZES)),
        ("ninfer lower --platform=cuda                     # the built-in model",
         "ninfer lower --model=/path/to/Qwen3-Next-80B-A3B-Instruct --dtype=bfloat16 --max_concurrency=8 "
         "--device_memory_bytes=206158430208",
         "ninfer lower --steps=decode,kernel --json")),
}
HELP_SUMMARY = "this list, or a command's flags and examples (ninfer help COMMAND)"

# Defaults of flags whose absl default is None and that are not engine settings.
_NONE_DEFAULTS = {
    "token_ids": "none: the prompt is --prompt",
    "server": "none: an in-process engine",
    "token": "$NINFER_TOKEN",
    "timeout": "no deadline",
    "messages": "one user message with --prompt",
    "session": "none",
    "turns": "one turn, or as many as stdin holds",
    "trace_limit": "every request",
    "compilation_cache": "$NINFER_COMPILATION_CACHE, else ~/.cache/ninfer/jax",
    "program": "model",
    "cache_device_bytes": "none: the pools are solved from the device's memory",
    "split": "one StateImage per max_context/4 of Main KV, 2C slots at least where Main KV keeps one max_context",
    "split_sweep": "none: one split",
    "steps": "every step",
    "image": "none",
    "allowed_local_media_path": "none: no local files",
    "max_input_pixels": "8192 x 8192",
    "max_input_frames": "the checkpoint's video processor max_frames",
}
_METAVARS = {"model": "FOLDER", "prompt": "TEXT", "token_ids": "IDS", "server": "HOST:PORT", "host": "HOST",
             "token": "TOKEN", "messages": "JSON|@FILE", "session": "ID", "compilation_cache": "FOLDER|off",
             "port": "PORT", "max_message_bytes": "BYTES", "host_capacity_bytes": "BYTES", "kv_capacity": "TOKENS",
             "max_context": "TOKENS", "chunk_size": "TOKENS", "turns": "N", "trace_limit": "N",
             "device_memory_bytes": "BYTES", "device_memory_fraction": "FRACTION", "cache_device_bytes": "BYTES",
             "split": "FRACTION", "split_sweep": "S1,S2,...", "platform": "cuda|rocm|cpu",
             "backend": "pallas|xla|interpret", "steps": "PREFIX,...", "image": "FILE",
             "media_cache_bytes": "BYTES", "allowed_local_media_path": "FOLDER", "max_input_pixels": "PIXELS",
             "max_input_frames": "N", "chat_template": "FILE"}


def engine_default(name: str) -> str | None:
    """What EngineConfig / ContextCacheConfig give an engine flag left unset, or None."""
    from ledger import capacity as ledger
    from ninfer_jax.config import ContextCacheConfig, EngineConfig
    from ninfer_jax.plan import DEFAULT_DEVICE_BUDGET

    if name == "kv_capacity":
        return (f"solved from the device's memory; a device with no memory statistics (CPU) gives the pools "
                f"a {_bytes(DEFAULT_DEVICE_BUDGET)} device budget")
    if name == "host_capacity_bytes":
        return (f"{_bytes(ledger.DEFAULT_HOST_BASE_BYTES)} + {ledger.HOST_STATE_IMAGES_IN_DEFAULT} StateImages, "
                "ContextCacheConfig.host_capacity_bytes")
    if name == "device_memory_bytes":
        return "the device's own (memory_stats() bytes_limit), EngineConfig.device_memory_bytes"
    if name == "device_state_slots":
        return "max_concurrency, ContextCacheConfig.device_state_slots"
    if name == "chat_template":
        return "the tokenizer's own template"
    if name == "media_cache_bytes":
        from ninfer_jax.config import DEFAULT_MEDIA_CACHE_BYTES

        return f"{DEFAULT_MEDIA_CACHE_BYTES >> 20} MiB, MediaConfig.cache_bytes"
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    if name in fields and fields[name].default is not dataclasses.MISSING:
        return f"{fields[name].default}, EngineConfig.{name}"
    fields = {f.name: f for f in dataclasses.fields(ContextCacheConfig)}
    if name in fields and fields[name].default is not dataclasses.MISSING:
        return f"{fields[name].default}, ContextCacheConfig.{name}"
    return None


def _bytes(n: int) -> str:
    return f"{n >> 30} GiB" if n % (1 << 30) == 0 else f"{n} bytes"


def _default(flag) -> str:
    if flag.default is None:
        return engine_default(flag.name) or _NONE_DEFAULTS.get(flag.name, "none")
    if isinstance(flag.default, bool):
        return "true" if flag.default else "false"
    if isinstance(flag.default, str):
        return repr(flag.default)
    return str(flag.default)


# A flag's help and default as one command shows them, where the shared text does not fit.
_OVERRIDES = {
    ("generate", "token"): ("bearer token to send to the server.", None),
    ("chat", "token"): ("bearer token to send to the server.", None),
    ("serve", "token"): ("bearer token clients must send (gRPC metadata, HTTP Authorization header).", None),
    ("trace", "program"): ("the real model, or the cost-model Program (no model math: large replays in seconds).",
                           None),
    ("bench", "program"): ("bench preempt: run only this Program.", "both"),
    ("bench", "quick"): ("bench preempt: the smallest run (the cost-model Program only, seconds).", None),
    ("bench", "json"): ("print the figures as one JSON object.", None),
    ("trace", "json"): ("print the figures as one JSON object.", None),
    ("plan", "json"): ("print the plan as one JSON object.", None),
    ("lower", "json"): ("print the results as one JSON object.", None),
    ("lower", "backend"): ("the kernels' backend: pallas (the Triton kernels), xla (their pure-JAX references) or "
                           "interpret.", "pallas for cuda and rocm, xla for cpu"),
    ("lower", "speculative_tokens"): ("k of the speculative steps lowered (prefill_spec, spec_decode, spec_commit); "
                                      "0: none.", "2 when the model has an MTP head, else 0"),
    ("trace", "max_tokens"): ("tokens to generate for requests whose trace line gives no output length.", None),
    ("trace", "cache_device_bytes"): (
        "--program=sim: N device bytes shared by Main KV pages, StateImage slots and backend pools instead of the "
        "device-memory solve; max_context defaults to the trace's longest request, raised as CFG-6 requires for "
        "the pool.", None),
    ("trace", "split"): ("the StateImage share of --cache_device_bytes, in (0, 1).", None),
    ("trace", "split_sweep"): ("replay --cache_device_bytes at each of these comma-separated StateImage shares "
                               "('default': the default rule's), report each and best_split (by cached_tokens).",
                               None),
    ("trace", "skip_too_long"): ("report requests that cannot fit max_context per request (requests_too_long) and "
                                 "replay the rest, instead of refusing; with --cache_device_bytes max_context is "
                                 "bounded by what Main KV holds.", None),
    ("plan", "cache_device_bytes"): ("show how N cache bytes split between StateImage slots and Main KV pages, as "
                                     "ninfer trace --cache_device_bytes would.", None),
    ("plan", "split"): ("with --cache_device_bytes: the StateImage share, in (0, 1).", None),
}
_SCOPE = re.compile(r"^(Engine|serve|chat|trace|lower|generate/chat( --server)?|bench preempt): ")


def _flag_line(command: str, name: str) -> str:
    flag = FLAGS[name]
    kind = flag.flag_type()
    about, default = _OVERRIDES.get((command, name), (None, None))
    if about is None:
        about = re.sub(r"^<[^>]*>: ", "", flag.help)  # absl prefixes an enum's help with its values
        about = _SCOPE.sub("", about)
    if kind == "bool":
        head = f"--[no]{name}"
    elif getattr(flag.parser, "enum_values", None):
        head = f"--{name}={'|'.join(flag.parser.enum_values)}"
    else:
        seconds = name.endswith("_s") or name == "timeout"
        head = f"--{name}=" + _METAVARS.get(name, {"int": "INT", "float": "SECONDS" if seconds else "FLOAT"}
                                             .get(kind, "TEXT"))
    body = textwrap.fill(about, width=96, initial_indent="      ", subsequent_indent="      ")
    return f"  {head}  (default {default or _default(flag)})\n{body}"


def _benches(benches: Mapping[str, str] | None) -> list[str]:
    """`NAME  first line of its docstring`, read from the source (no import, no JAX)."""
    import ast
    import importlib.util

    if benches is None:
        from ninfer_jax.bench import BENCHES as benches

    out = []
    for name, module in benches.items():
        about = ""
        try:
            spec = importlib.util.find_spec(module)
            with open(spec.origin, encoding="utf-8") as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            about = " ".join(doc.split("\n\n")[0].split())
            if about.startswith("`") and "`: " in about:
                about = about.split("`: ", 1)[1]
        except (ImportError, AttributeError, OSError, SyntaxError, TypeError):
            pass
        out.append(f"  {name:<9} {about}")
    return out


def with_section(command: Command, title: str, names: tuple[str, ...], *, before: str | None = None,
                 after: str | None = None) -> Command:
    """`command` with the flags `names` added: to its section `title` if it has one (after its
    flag `after`, else at its end), else as a new section before the section `before` (at the
    end without one)."""
    sections = list(command.sections)
    titles = [t for t, _ in sections]
    if title in titles:
        i = titles.index(title)
        have = sections[i][1]
        at = have.index(after) + 1 if after in have else len(have)
        sections[i] = (title, have[:at] + names + have[at:])
    else:
        sections.insert(titles.index(before) if before in titles else len(sections), (title, names))
    return dataclasses.replace(command, sections=tuple(sections))


def command_help(name: str, commands: Mapping[str, Command] | None = None,
                 benches: Mapping[str, str] | None = None) -> str:
    cmd = (COMMANDS if commands is None else commands)[name]
    lines = [f"usage: {cmd.usage}", "", textwrap.fill(cmd.about, width=100), ""]
    if name == "bench":
        lines += ["benches:", *_benches(benches), ""]
    for title, names in cmd.sections:
        lines.append(f"{title} flags:")
        lines += [_flag_line(name, n) for n in names]
        lines.append("")
    lines.append("examples:")
    lines += [f"  {e}" for e in cmd.examples]
    lines += ["", "ninfer --help lists the commands; ninfer --helpfull lists every flag, absl's included."]
    return "\n".join(lines)


def general_help(commands: Mapping[str, Command] | None = None) -> str:
    commands = COMMANDS if commands is None else commands
    width = max(len(n) for n in commands)
    lines = ["ninfer: inference for hybrid Gated DeltaNet + attention models (NInfer-JAX)", "",
             "usage: ninfer COMMAND [flags]", "", "commands:"]
    lines += [f"  {n:<{width}}  {c.summary}" for n, c in commands.items()]
    lines += [f"  {'help':<{width}}  {HELP_SUMMARY}", "",
              "ninfer help COMMAND, ninfer COMMAND --help or -h: a command's flags, defaults and examples.",
              "ninfer --helpfull: every flag, absl's included.", "",
              "example:", '  ninfer generate --prompt "Hello"']
    return "\n".join(lines)


def full_help(commands: Mapping[str, Command] | None = None) -> str:
    from absl import app

    app.define_help_flags()
    return general_help(commands) + "\n\nall flags:\n" + FLAGS.get_help()


def help_request(args: list[str], commands: Mapping[str, Command] | None = None,
                 benches: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """If `args` (the command line after the program name) asks for help: (exit status, text);
    else None. Arguments after `--` belong to a benchmark and are not looked at. `commands`,
    `benches`: the program's (default: ninfer_jax's own)."""
    commands = COMMANDS if commands is None else commands
    if "--" in args:
        args = args[:args.index("--")]
    wants = any(a in HELP_ARGS for a in args)
    full = any(a in HELPFULL_ARGS for a in args)
    command = next((a for a in args if a in commands or a == "help"), None)
    if full:
        return 0, full_help(commands)
    if command == "help":
        rest = [a for a in args[args.index("help") + 1:] if not a.startswith("-")]
        if not rest:
            return 0, general_help(commands)
        if rest[0] not in commands:
            return 2, f"ninfer help: unknown command {rest[0]!r}; ninfer --help lists the commands"
        return 0, command_help(rest[0], commands, benches)
    if not wants:
        return None
    return 0, command_help(command, commands, benches) if command else general_help(commands)
