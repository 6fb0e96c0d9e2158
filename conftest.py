"""Shared pytest set-up: float64 must be available for the float64 parity tests.

With x64 enabled, JAX still computes in float32 whenever the inputs and parameters are float32 (the
library never relies on default dtypes), so float32 tests keep their meaning.
"""
import jax

jax.config.update("jax_enable_x64", True)
