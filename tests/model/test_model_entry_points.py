"""The documented entry points: `ninfer_jax.model.load_model` (and its re-export from
`ninfer_jax`) load the built-in model and return the same `Model` type as the module itself."""
from __future__ import annotations

import numpy as np
import pytest

import ninfer_jax
import ninfer_jax.model as model_pkg
from ninfer_jax.model import model as model_mod


def test_load_model_is_importable_where_documented():
    from ninfer_jax.model import Model, load_model

    assert load_model is model_mod.load_model and Model is model_mod.Model
    assert ninfer_jax.load_model is load_model
    assert "load_model" in ninfer_jax.__all__ and "load_model" in model_pkg.__all__
    m = load_model("builtin:tiny-hybrid", dtype="float32")
    assert isinstance(m, Model)
    logits = np.asarray(m.forward([1, 2, 3]))
    assert logits.shape[-1] == m.config.vocab_size and np.isfinite(logits).all()


def test_unknown_names_still_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(model_pkg, "nope")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr(ninfer_jax, "nope")
