import pytest

from ninfer_jax.model.model import load_model


@pytest.fixture(scope="session")
def tiny_model():
    """The built-in model, loaded once; every engine in these tests shares its parameters."""
    return load_model("builtin:tiny-hybrid")


@pytest.fixture(scope="session")
def plain_and_spec():
    """Two engines on the built-in model running their own threads (C = 2, max_context 256,
    chunk 32): one plain, one drafting with its MTP head (k = 2), for tests that compare them.
    Shared by every module that asks (their warm-up is the cost): what one test leaves in their
    caches never changes another's tokens (doctrine 1), which is what these tests compare."""
    from ninfer_jax import Engine, EngineConfig

    kw = dict(max_concurrency=2, max_context=256, chunk_size=32, progress=False)
    plain, spec = Engine(EngineConfig(**kw)), Engine(EngineConfig(**kw, speculative_tokens=2))
    yield plain, spec
    plain.close()
    spec.close()
