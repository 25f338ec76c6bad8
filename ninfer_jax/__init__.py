"""NInfer-JAX: an inference engine for hybrid (Gated DeltaNet + gated attention) models."""
from ninfer_jax.config import ContextCacheConfig, EngineConfig
from ninfer_jax.engine import Completion, Engine, RequestHandle, SamplingParams, TokenDelta, Usage

__version__ = "0.1.0"
__all__ = ["Completion", "ContextCacheConfig", "Engine", "EngineConfig", "RequestHandle", "SamplingParams",
           "TokenDelta", "Usage"]
