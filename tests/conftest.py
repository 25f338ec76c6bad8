"""Test-wide settings: CPU JAX and float32 exactness."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI turns JAX's persistent compilation cache on by default; tests that run the CLI (in
# process or as subprocesses) must not write into the user's cache folder or make later tests
# read compiled programs from disk. test_compile_cache.py names its own folder.
os.environ.setdefault("NINFER_COMPILATION_CACHE", "off")
# Engines price sources and pause routes with costs measured at warm-up (SRC-3); measured
# prices vary with the machine's load, so the suite uses the fixed default and stays
# reproducible. tests/engine/test_engine_cost_model.py calibrates explicitly.
os.environ.setdefault("NINFER_COST_MODEL", "off")


def pytest_addoption(parser):
    """`--budget=SECONDS`: how long the randomized pressure soak runs (tests/engine/test_engine_soak.py);
    0 (default) is the short seeded CI run."""
    parser.addoption("--budget", action="store", type=float, default=0.0,
                     help="seconds for the long randomized engine soak (0: the short CI run only)")
