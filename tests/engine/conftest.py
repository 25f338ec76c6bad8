import pytest

from ninfer_jax.model.model import load_model


@pytest.fixture(scope="session")
def tiny_model():
    """The built-in model, loaded once; every engine in these tests shares its parameters."""
    return load_model("builtin:tiny-hybrid")
