"""The model: HF config parsing, safetensors loading, the layers, the reference forward and the
paged steps. `load_model` and `Model` are the entry points (read lazily, so that importing the
package for its config types does not load JAX's model code)."""
from __future__ import annotations

__all__ = ["Model", "load_model"]


def __getattr__(name: str):
    if name in __all__:
        from ninfer_jax.model import model

        return getattr(model, name)
    raise AttributeError(f"module 'ninfer_jax.model' has no attribute {name!r}")
