"""The engine: request records, the scheduling cycle, sampling, streaming, the public API."""
from ninfer_jax.engine.engine import Engine
from ninfer_jax.engine.request import RequestHandle
from ninfer_jax.engine.types import Completion, SamplingParams, TokenDelta, TokenLogprob, Usage

__all__ = ["Completion", "Engine", "RequestHandle", "SamplingParams", "TokenDelta", "TokenLogprob", "Usage"]
