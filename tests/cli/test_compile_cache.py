"""The persistent compilation cache: where it lives, how it is turned off, and that a second
`ninfer generate` in the same cache folder compiles nothing."""
import json
import os
import re
import subprocess
import sys

import jax
import pytest

from ninfer_jax import compile_cache
from ninfer_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# `ninfer generate` in this process with a CompileCounter started first; the counts go to
# stderr at exit as one `COMPILES {...}` line.
_COUNTED_GENERATE = """
import atexit, json, sys
from ninfer_jax.compile_cache import CompileCounter
counter = CompileCounter().start()
atexit.register(lambda: print("COMPILES " + json.dumps(counter.as_dict()), file=sys.stderr))
from ninfer_jax.cli import run
run(["ninfer", "generate"] + sys.argv[1:])
"""


@pytest.fixture
def jax_cache_config():
    """enable() changes process-wide JAX settings: put them back after the test."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    saved = {n: getattr(jax.config, n) for n in names}
    yield
    for n, v in saved.items():
        jax.config.update(n, v)
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()


def test_folder_from_flag_env_or_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.resolve(None) == str(tmp_path / "xdg" / "ninfer" / "jax")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.resolve(None) == str(tmp_path / "home" / ".cache" / "ninfer" / "jax")
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
    assert compile_cache.resolve(None) == str(tmp_path / "env")
    assert compile_cache.resolve(str(tmp_path / "flag")) == str(tmp_path / "flag"), "the flag beats the env"
    assert compile_cache.resolve("off") is None and compile_cache.resolve("OFF") is None
    monkeypatch.setenv(compile_cache.ENV, "off")
    assert compile_cache.resolve(None) is None
    assert compile_cache.resolve(str(tmp_path / "flag")) == str(tmp_path / "flag")


def test_enable_creates_the_folder_sets_jax_and_is_idempotent(tmp_path, jax_cache_config):
    folder = tmp_path / "a" / "b"
    assert compile_cache.enable(str(folder)) == str(folder)
    assert folder.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(folder)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    assert compile_cache.enable(str(folder)) == str(folder)
    assert jax.config.jax_compilation_cache_dir == str(folder)
    assert compile_cache.enable("off") is None
    assert jax.config.jax_compilation_cache_dir is None


def test_enable_refuses_a_folder_it_cannot_create(tmp_path, jax_cache_config):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError) as err:
        compile_cache.enable(str(blocker / "cache"))
    assert err.value.field == "compilation_cache" and str(blocker / "cache") in str(err.value)


def _generate(cache: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _COUNTED_GENERATE, f"--compilation_cache={cache}", "--prompt=Hello", "--max_tokens=2",
         "--max_concurrency=1", "--max_context=256", "--temperature=0"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    line = [l for l in out.stderr.splitlines() if l.startswith("COMPILES ")]
    assert len(line) == 1, out.stderr
    said = [l for l in out.stderr.splitlines() if l.startswith("[ninfer] executables: ")]
    assert len(said) == 1, out.stderr
    return dict(json.loads(line[0][len("COMPILES "):]), text=out.stdout, said=said[0], stderr=out.stderr)


def test_second_generate_in_the_same_cache_compiles_nothing(tmp_path):
    cache = tmp_path / "jax-cache"
    first = _generate(str(cache))
    assert first["compiled"] > 0 and first["cache_hits"] == 0
    assert len(os.listdir(cache)) > 0, "the first run wrote nothing to the cache"
    second = _generate(str(cache))
    assert second["compiled"] == 0, f"the second run compiled {second['compiled']} executables"
    assert second["cache_hits"] == second["requests"] > 0
    assert second["text"] == first["text"], "an executable from the cache generated other tokens"
    # The progress output tells cache hits from compilations (JAX's own cache events).
    # (The counter also sees the small eager programs JAX compiles; the line counts the steps
    # and the pools' byte movers.)
    first_n = re.fullmatch(r"\[ninfer\] executables: (\d+) compiled, 0 from cache", first["said"])
    second_n = re.fullmatch(r"\[ninfer\] executables: 0 compiled, (\d+) from cache", second["said"])
    assert first_n and second_n, (first["said"], second["said"])
    assert 0 < int(first_n.group(1)) == int(second_n.group(1)) <= second["cache_hits"]
    assert "] compiled: " not in second["stderr"] and "read from the compilation cache: decode" in second["stderr"]
