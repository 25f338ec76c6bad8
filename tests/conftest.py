"""Test-wide settings: CPU JAX and float32 exactness (DESIGN.md, "Kernels and compilation")."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_addoption(parser):
    """`--budget=SECONDS`: how long the randomized pressure soak runs (tests/engine/test_engine_soak.py);
    0 (default) is the short seeded CI run."""
    parser.addoption("--budget", action="store", type=float, default=0.0,
                     help="seconds for the long randomized engine soak (0: the short CI run only)")
