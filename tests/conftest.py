"""Test-wide settings: CPU JAX and float32 exactness (DESIGN.md, "Kernels and compilation")."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
