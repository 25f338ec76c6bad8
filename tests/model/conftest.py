import pytest

from ninfer_jax.model.model import load_model
from ninfer_jax.model.compiled import CompiledSteps
from oracle_paths import ORACLE_TYPES, oracle_dir



@pytest.fixture(scope="session")
def builtin_model():
    return load_model("builtin:tiny-hybrid")


@pytest.fixture(scope="session")
def builtin_steps(builtin_model):
    return CompiledSteps(builtin_model, progress=False)


@pytest.fixture(scope="session")
def oracle_models():
    """Each oracle fixture loaded once, with its step functions (compiled lazily)."""
    out = {}
    for t in ORACLE_TYPES:
        model = load_model(oracle_dir(t))
        out[t] = (model, CompiledSteps(model, progress=False))
    return out
