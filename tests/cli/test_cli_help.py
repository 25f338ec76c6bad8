"""`ninfer --help | -h | help [COMMAND] | COMMAND --help`: the commands, a command's own flags with
defaults and examples, exit 0; absl's flags only under --helpfull. And the JAX probe line filter."""
import logging
import os
import subprocess
import sys

import pytest

from ninfer_jax import cli
from server import cli as ninfer_cli  # the whole `ninfer`: ninfer_jax's commands and the server's
from server.cli import BENCHES

ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _help(capsys, *args):
    with pytest.raises(SystemExit) as done:
        ninfer_cli.run(["ninfer", *args])
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def _flags_of(text):
    return {line.split()[0].split("=")[0].replace("--[no]", "--") for line in text.splitlines()
            if line.startswith("  --")}


def test_general_help_lists_every_command(capsys):
    for args in (["--help"], ["-h"], ["help"]):
        code, out, err = _help(capsys, *args)
        assert code == 0 and err == ""
        for command in ("generate", "chat", "serve", "bench", "trace", "help"):
            assert f"\n  {command} " in out, (args, command)
        assert "ninfer help COMMAND" in out and "USAGE:" not in out
        assert not _flags_of(out), "the command list shows no flags"


def test_generate_help_shows_its_own_flags_with_defaults(capsys):
    code, out, err = _help(capsys, "generate", "--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: ninfer generate")
    assert "  --max_tokens=INT  (default 32)" in out
    assert "  --max_concurrency=INT  (default 4, EngineConfig.max_concurrency)" in out
    assert ("  --kv_capacity=TOKENS  (default solved from the device's memory; a device with no memory statistics "
            "(CPU) gives the pools a 1 GiB device budget)") in out
    assert "  --device_memory_fraction=FRACTION  (default 0.9, EngineConfig.device_memory_fraction)" in out
    assert "(default 8 GiB + 8 StateImages, ContextCacheConfig.host_capacity_bytes)" in out
    assert "  --dtype=auto|float32|bfloat16  (default 'auto')" in out
    flags = _flags_of(out)
    assert {"--prompt", "--token_ids", "--temperature", "--seed", "--server", "--wait_s", "--model",
            "--compilation_cache"} <= flags
    assert not flags & {"--grace_s", "--host", "--port", "--messages", "--trace_format", "--verbosity", "--helpfull"}
    assert "examples:\n  ninfer generate" in out
    assert _help(capsys, "generate", "-h") == (0, out, "")
    assert _help(capsys, "help", "generate") == (0, out, "")


def test_serve_bench_trace_help(capsys):
    code, out, _ = _help(capsys, "help", "serve")
    assert code == 0 and {"--grace_s", "--port", "--host", "--max_message_bytes"} <= _flags_of(out)
    assert "--prompt" not in _flags_of(out) and "--temperature" not in _flags_of(out)
    code, out, _ = _help(capsys, "bench", "--help")
    assert code == 0
    for name in BENCHES:
        assert f"\n  {name} " in out
    assert {"--json", "--quick", "--program"} <= _flags_of(out)
    code, out, _ = _help(capsys, "trace", "-h")
    assert code == 0 and {"--program", "--trace_format", "--trace_limit", "--cold"} <= _flags_of(out)


def test_help_for_an_unknown_command_is_exit_2(capsys):
    code, out, err = _help(capsys, "help", "frobnicate")
    assert code == 2 and out == "" and err.strip() == (
        "ninfer help: unknown command 'frobnicate'; ninfer --help lists the commands")


def test_helpfull_adds_absl_flags(capsys):
    code, out, _ = _help(capsys, "--helpfull")
    assert code == 0 and "--verbosity" in out and "--max_tokens" in out
    assert "--verbosity" not in _help(capsys, "--help")[1]


def test_bench_args_after_double_dash_are_not_help():
    from ninfer_jax.cli_help import help_request

    assert help_request(["bench", "preempt", "--", "--help"]) is None
    assert help_request(["generate", "--prompt=-h"]) is None


def test_ninfer_help_as_a_command(capsys):
    """The real entry point: help intercepted before absl (no USAGE banner), exit 0."""
    out = subprocess.run([sys.executable, "-m", "server.cli", "--help"], capture_output=True, text=True,
                         env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(f"\n  {c} " in out.stdout for c in ("generate", "chat", "serve", "bench", "trace"))
    assert "USAGE:" not in out.stdout + out.stderr and "Try --helpfull" not in out.stdout + out.stderr


def test_port_out_of_range_exits_2_through_absl():
    out = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--port", "70000"], capture_output=True,
                         text=True, env=ENV, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "ninfer serve: IllegalFlagValueError: flag --port=70000: 70000 is not an integer in the range [-1, 65535] "
        "(ninfer serve --help lists the flags)"]


def test_remote_bad_token_ids_without_a_server_is_one_line():
    out = subprocess.run([sys.executable, "-m", "server.cli", "generate", "--server=127.0.0.1:1",
                          "--token_ids=1,x"], capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "ninfer generate: RequestError: prompt: --token_ids must be comma-separated integers, got '1,x'"]


def test_routine_jax_lines_are_dropped_and_warnings_kept(caplog):
    cli.quiet_routine_jax_logs()
    cli.quiet_routine_jax_logs()  # idempotent
    probe = logging.getLogger("jax._src.xla_bridge")
    assert sum(isinstance(f, cli._DropRoutine) for f in probe.filters) == 1
    with caplog.at_level(logging.INFO):
        probe.info("Unable to initialize backend '%s': %s", "tpu", "INTERNAL: Failed to open libtpu.so")
        probe.info("Unable to initialize backend 'cuda': no GPU")
        probe.warning("Unable to initialize backend 'tpu': as a warning")
        logging.getLogger("jax._src.compilation_cache").info("Resetting cache at %s.", "<empty>")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["Unable to initialize backend 'cuda': no GPU", "Unable to initialize backend 'tpu': as a warning"]
