"""The cost-model Program (`SimProgram`): the engine loop without model math."""
from ninfer_jax.sim.program import CostModel, SimProgram

__all__ = ["CostModel", "SimProgram"]
