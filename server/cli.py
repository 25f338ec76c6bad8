"""`ninfer`, the whole program: ninfer_jax's commands and the server's (the console script).

The layers import downward only: server → ninfer_jax → {ledger, pallas_kernels}. ninfer_jax's
CLI (ninfer_jax/cli.py) holds generate, chat, bench, trace, plan and lower on an in-process
engine, and knows nothing of the server; this module, one layer up, adds what needs the server:

- `ninfer serve`: the gRPC service and the OpenAI-compatible HTTP API (server/cli_commands.py);
- `ninfer generate|chat --server=HOST:PORT`: the same commands against a running server;
- `ninfer bench serve`: the service's overhead over the in-process engine (server/serve_bench.py).

Their flags are defined here, their help is ninfer_jax's `cli_help.COMMANDS` with theirs added,
and `run` is ninfer_jax's `cli.run` over the whole program's `COMMANDS`. `python -m server.cli`
is `ninfer`.
"""
from __future__ import annotations

from absl import flags

from ninfer_jax import bench, cli, cli_flags, cli_help

FLAGS = flags.FLAGS

flags.DEFINE_string("server", None, "generate/chat: HOST:PORT of a running `ninfer serve` to use instead of an "
                    "in-process engine.")
flags.DEFINE_string("host", "127.0.0.1", "serve: address to bind (loopback unless you say otherwise).")
flags.DEFINE_integer("port", 50051, "serve: gRPC port to bind (0 = any free port, -1 = no gRPC: HTTP only).",
                     lower_bound=-1, upper_bound=65535)
flags.DEFINE_boolean("http", False, "bench serve: also run the load through the OpenAI-compatible HTTP API and "
                     "report its ratios.")
flags.DEFINE_integer("http_port", None, "serve: also serve the OpenAI-compatible HTTP API on this port (0 = any "
                     "free port), same host, token and limits.", lower_bound=0, upper_bound=65535)
flags.DEFINE_string("token", None, "serve: bearer token required in metadata; generate/chat --server: token to "
                    "send. Default: $NINFER_TOKEN.")
flags.DEFINE_float("wait_s", 120.0, "generate/chat --server: seconds to wait for the server to become SERVING",
                   lower_bound=0.0)
flags.DEFINE_float("grace_s", 10.0, "serve: seconds running streams get to finish on SIGTERM/SIGINT.",
                   lower_bound=0.0)
flags.DEFINE_integer("max_message_bytes", 8 << 20, "serve: largest gRPC message.", lower_bound=1024)
flags.DEFINE_float("timeout", None, "generate/chat --server: deadline of the call in seconds.")
# The HTTP API's own settings (server/http_settings.py)
flags.DEFINE_multi_string("served_model_name", None, "serve: a name requests may give as `model` (repeat for "
                          "several; the first is the one answers report). Default: the model's own name.")
flags.DEFINE_list("cors_origins", [], "serve: comma-separated origins a browser may call the HTTP API from "
                  "(* = any). Default: no CORS headers.")
flags.DEFINE_bool("access_log", True, "serve: one line per HTTP request on stderr (method, path, status, request "
                  "id, tokens, TTFT, duration).")
flags.DEFINE_string("request_log", None, "serve: a file that gets one JSON line per finished HTTP generation "
                    "request (ids, tokens, timing, the recovery point of its hit, its pauses).")
flags.DEFINE_integer("max_responses", 1024, "serve: most stored Responses (/v1/responses with store=true).",
                     lower_bound=1)
flags.DEFINE_integer("responses_max_bytes", 64 << 20, "serve: most bytes of stored Responses (their JSON); the "
                     "least recently used go first.", lower_bound=1)
flags.DEFINE_float("responses_ttl_s", None, "serve: seconds a stored Response is kept (default: until evicted).")
flags.DEFINE_string("responses_store", None, "serve: a folder that keeps stored Responses across restarts "
                    "(default: memory only).")
HTTP_SETTINGS = ("served_model_name", "cors_origins", "access_log", "request_log", "max_responses",
                 "responses_max_bytes", "responses_ttl_s", "responses_store")


def http_settings():
    """The HTTP API's settings from the flags (a ValueError names a bad one; a --request_log file
    that cannot be opened for appending is refused here, before the model loads)."""
    from server.http_settings import HttpSettings
    from server.request_log import check_writable

    try:
        settings = HttpSettings(served_model_names=tuple(FLAGS.served_model_name or ()),
                                cors_origins=tuple(o.strip() for o in FLAGS.cors_origins if o.strip()),
                                access_log=FLAGS.access_log, request_log=FLAGS.request_log,
                                max_responses=FLAGS.max_responses, responses_max_bytes=FLAGS.responses_max_bytes,
                                responses_ttl_s=FLAGS.responses_ttl_s, responses_store=FLAGS.responses_store)
    except ValueError as exc:
        raise cli.UsageError(str(exc)) from None
    if settings.request_log is not None:
        try:
            check_writable(settings.request_log)
        except OSError as exc:
            raise cli.UsageError(f"request_log: cannot open {settings.request_log!r} for appending: "
                                 f"{exc.strerror or exc}") from None
    return settings

REMOTE = ("server", "token", "timeout", "wait_s")
SERVE = cli_help.Command(
    "run the gRPC service (ninfer.v1) and/or the OpenAI-compatible HTTP API until SIGTERM/SIGINT",
    "ninfer serve [--host=HOST] [--port=PORT] [--http_port=PORT] [flags]",
    "Serves the model over gRPC, and with --http_port over the OpenAI-compatible HTTP API "
    "(/v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /health, /metrics; "
    "docs/http.md); --port=-1 serves HTTP only. Health stays NOT_SERVING (HTTP /health 503) "
    "until the engine has warmed up. --model=fake:NAME serves a deterministic fake engine "
    "(no model, no compilation).",
    (("service", ("host", "port", "http_port", "token", "grace_s", "max_message_bytes")),
     ("http", HTTP_SETTINGS),
     ("model", cli_help.MODEL), ("engine", cli_help.ENGINE), ("media", cli_help.MEDIA)),
    ("ninfer serve --port 50051",
     "ninfer serve --port=-1 --http_port=8000          # the OpenAI-compatible HTTP API only",
     "ninfer serve --model=fake:demo --port 0          # try the service without a model"))
BENCHES = {"serve": "server.serve_bench", **bench.BENCHES}


def cmd_serve(args: list[str]) -> int:
    """Run the gRPC service (and with --http_port the OpenAI-compatible HTTP API) until SIGTERM/SIGINT
    (server/cli_commands.py)."""
    fake = FLAGS.model.startswith("fake:")  # server.fake_engine's fake engine: no model, no JAX work
    try:
        cli.no_arguments("serve", args)
        settings = http_settings()
        unused = [name for name in HTTP_SETTINGS if FLAGS[name].present]
        if FLAGS.http_port is None and unused:  # nothing is silently dropped
            raise cli.UsageError(f"--{unused[0]} configures the HTTP API: give --http_port=PORT as well")
        if not fake:
            from ninfer_jax.engine.preflight import preflight

            preflight(cli_flags.engine_config_from_flags())
            cli.enable_compilation_cache()
        elif FLAGS.chat_template is not None:  # the fake renders with it too
            from ninfer_jax.engine.intake import read_chat_template

            read_chat_template(FLAGS.chat_template)
    except cli.usage_errors() as e:
        return cli.refuse("serve", e)
    from server.cli_commands import serve

    if FLAGS.port < 0 and FLAGS.http_port is None:
        return cli.refuse("serve", ValueError("--port=-1 turns gRPC off; give --http_port=PORT to serve HTTP instead"))
    return serve(model=FLAGS.model, host=FLAGS.host, port=None if FLAGS.port < 0 else FLAGS.port,
                 http_port=FLAGS.http_port, token=FLAGS.token, grace_s=FLAGS.grace_s,
                 max_message_bytes=FLAGS.max_message_bytes, http_settings=settings,
                 **cli_flags.engine_settings())


def cmd_generate(args: list[str]) -> int:
    """`ninfer generate`: with --server on that server (server/cli_commands.py), else in process."""
    if not FLAGS.server:
        return cli.cmd_generate(args)
    try:
        cli.no_arguments("generate", args)
        cli_flags.sampling()
        prompt = cli_flags.prompt_arg()
    except cli.usage_errors() as e:
        return cli.refuse("generate", e)
    from server.cli_commands import generate_remote

    try:
        return generate_remote(FLAGS.server, prompt, cli_flags.sampling_dict(), token=FLAGS.token,
                               timeout=FLAGS.timeout, wait_s=FLAGS.wait_s)
    except cli.usage_errors() as e:
        return cli.refuse("generate", e)


def cmd_chat(args: list[str]) -> int:
    """`ninfer chat`: with --server on that server (server/cli_commands.py), else in process."""
    if not FLAGS.server:
        return cli.cmd_chat(args)
    try:
        cli.no_arguments("chat", args)
        messages = cli_flags.chat_messages()
        cli_flags.sampling()
    except cli.usage_errors() as e:
        return cli.refuse("chat", e)
    turns = cli_flags.stdin_turns()
    from server.cli_commands import chat_remote

    try:
        history = messages if turns is None or FLAGS.messages else []  # as in process: --prompt is not a turn
        return chat_remote(FLAGS.server, history, cli_flags.sampling_dict(), session=FLAGS.session,
                           token=FLAGS.token, timeout=FLAGS.timeout, wait_s=FLAGS.wait_s, turns=turns)
    except cli.usage_errors() as e:
        return cli.refuse("chat", e)


def cmd_bench(args: list[str]) -> int:
    """`ninfer bench`: ninfer_jax's benchmarks and `serve`, which --http passes on to."""
    return cli.cmd_bench(args, BENCHES, ["--http"] if FLAGS.http else [])


def _help() -> dict[str, cli_help.Command]:
    """ninfer_jax's commands' help with the server's flags added, and `serve` after `chat`."""
    own = dict(cli_help.COMMANDS)
    for name in ("generate", "chat"):
        own[name] = cli_help.with_section(own[name], "--server", REMOTE, before="engine")
    own["bench"] = cli_help.with_section(own["bench"], "bench", ("http",), after="program")
    out = {}
    for name, command in own.items():
        out[name] = command
        if name == "chat":
            out["serve"] = SERVE
    return out


COMMANDS = cli.Commands(
    handlers={**cli.ENGINE.handlers, "generate": cmd_generate, "chat": cmd_chat, "serve": cmd_serve,
              "bench": cmd_bench},
    help=_help(), benches=BENCHES)


def main(argv: list[str]) -> int:
    """`cli.main` over the whole program's commands (argv: [program, COMMAND, args...], flags parsed)."""
    return cli.main(argv, COMMANDS)


def parse_flags(argv: list[str]) -> list[str]:
    return cli.parse_flags(argv, COMMANDS)


def run(argv: list[str] | None = None) -> None:
    """The `ninfer` console script (pyproject.toml)."""
    cli.run(argv, COMMANDS)


if __name__ == "__main__":
    run()
