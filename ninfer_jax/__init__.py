"""NInfer-JAX: an inference engine for hybrid (Gated DeltaNet + gated attention) models."""
from ninfer_jax.config import ContextCacheConfig, EngineConfig
from ninfer_jax.engine import Completion, Engine, RequestHandle, SamplingParams, TokenDelta, Usage

__version__ = "0.1.0"
__all__ = ["Completion", "ContextCacheConfig", "Engine", "EngineConfig", "RequestHandle", "SamplingParams",
           "TokenDelta", "Usage", "load_model"]


def __getattr__(name: str):
    if name == "load_model":  # the documented entry point, re-exported from ninfer_jax.model
        from ninfer_jax.model import load_model

        return load_model
    raise AttributeError(f"module 'ninfer_jax' has no attribute {name!r}")
