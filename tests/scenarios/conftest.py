import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "engine"))  # engine_helpers

from ninfer_jax.model.model import load_model  # noqa: E402


@pytest.fixture(scope="session")
def scn_model():
    return load_model("builtin:tiny-hybrid")
