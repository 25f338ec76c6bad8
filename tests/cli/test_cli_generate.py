"""The README's first command: `ninfer generate` on the built-in model, as a newcomer runs it."""
import os
import subprocess
import sys

ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _ninfer(*args):
    return subprocess.run([sys.executable, "-m", "ninfer_jax.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=300)


def test_generate_streams_text_to_stdout_and_progress_to_stderr():
    out = _ninfer("generate", "--prompt", "Hello", "--max_tokens", "8", "--max_concurrency", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "no generated text on stdout"
    assert "[ninfer]" not in out.stdout
    assert "8 generated" in out.stderr


def test_generate_bad_token_ids_is_a_clear_error():
    """Refused before the model loads (engine/preflight.py): one line, exit 2."""
    out = _ninfer("generate", "--token_ids", "1,2,99999", "--max_concurrency", "1")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "ninfer generate: RequestError: prompt: token id 99999 outside the vocabulary [0, 1024)"]


def test_unknown_command():
    out = _ninfer("frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr
