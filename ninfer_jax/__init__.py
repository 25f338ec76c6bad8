"""NInfer-JAX: an inference engine for hybrid (Gated DeltaNet + gated attention) models."""

__version__ = "0.1.0"
