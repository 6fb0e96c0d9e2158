"""The CPU small-loop settings: how they edit XLA_FLAGS, when they refuse to, and that XLA acts on them."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jax_scan_rnn import versions, xla_flags

THRESHOLD = f"{xla_flags.SMALL_LOOP_OPTION}={xla_flags.SMALL_LOOP_BYTES}"
TILING = f"{xla_flags.GEMV_TILING_OPTION}={xla_flags.GEMV_TILING}"
OPTION = f"{THRESHOLD},{TILING}"


def test_options_are_added_to_empty_flags():
    assert xla_flags.with_backend_options("") == f"--xla_backend_extra_options={OPTION}"


def test_other_flags_are_kept():
    flags = "--xla_force_host_platform_device_count=4"
    assert xla_flags.with_backend_options(flags) == f"{flags} --xla_backend_extra_options={OPTION}"


def test_existing_extra_options_are_extended_not_repeated():
    flags = "--xla_backend_extra_options=xla_cpu_disable_new_fusion_emitter --foo=1"
    got = xla_flags.with_backend_options(flags)
    assert got == f"--xla_backend_extra_options=xla_cpu_disable_new_fusion_emitter,{OPTION} --foo=1"
    assert got.count("--xla_backend_extra_options") == 1


def test_an_option_the_user_gives_keeps_the_users_value():
    flags = f"--xla_backend_extra_options={xla_flags.GEMV_TILING_OPTION}=4"
    assert xla_flags.with_backend_options(flags) == f"{flags},{THRESHOLD}"
    assert xla_flags.with_backend_options(f"{flags},{THRESHOLD}") == f"{flags},{THRESHOLD}"


@pytest.fixture
def no_backend(monkeypatch):
    monkeypatch.setattr(xla_flags, "_status", xla_flags.status())  # restored after the test
    monkeypatch.setattr(xla_flags, "_backends_initialized", lambda: False)


def test_configure_sets_the_flag(no_backend):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert xla_flags.configure(env) == "set"
    assert OPTION in env["XLA_FLAGS"] and "device_count=2" in env["XLA_FLAGS"]
    assert xla_flags.status() == "set"


def test_configure_keeps_a_users_own_threshold(no_backend):
    env = {"XLA_FLAGS": f"--xla_backend_extra_options={xla_flags.SMALL_LOOP_OPTION}=0"}
    assert xla_flags.configure(env) == "set"  # the tiling added, the user's threshold kept
    assert env["XLA_FLAGS"] == f"--xla_backend_extra_options={xla_flags.SMALL_LOOP_OPTION}=0,{TILING}"
    users = f"--xla_backend_extra_options={xla_flags.SMALL_LOOP_OPTION}=0,{xla_flags.GEMV_TILING_OPTION}=8"
    env = {"XLA_FLAGS": users}
    assert xla_flags.configure(env) == "user"
    assert env["XLA_FLAGS"] == users


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_configure_can_be_opted_out_of(no_backend, value):
    env = {xla_flags.OPT_OUT_ENV: value}
    assert xla_flags.configure(env) == "opted out"
    assert "XLA_FLAGS" not in env


def test_configure_does_nothing_once_a_backend_exists(monkeypatch):
    monkeypatch.setattr(xla_flags, "_status", xla_flags.status())
    monkeypatch.setattr(xla_flags, "_backends_initialized", lambda: True)
    env = {}
    assert xla_flags.configure(env) == "too late"
    assert env == {}


def _run(code: str, **env_overrides) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_flags.OPT_OUT_ENV)}
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


SMALL_CALL_PROBE = """
    import jax, jax.numpy as jnp
    from flax import nnx
    import jax_scan_rnn as jsr
    model = jsr.Traveller(3, 8, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    f = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0])
    text = f.lower(state, jnp.ones((1, 50, 3))).compile().as_text()
    print(jsr.xla_flags.status(), "xla_cpu_small_call" in text)
"""


def test_importing_the_package_makes_xla_compile_a_batch1_scan_as_one_kernel():
    # The attribute XLA puts on a loop it compiled whole; without the setting the loop stays thunk by thunk, up to
    # jax 0.10 (CI's, on Python 3.11). jax 0.12 (Python 3.13, tried on 2026-12-03) compiles it whole by itself.
    import jax

    assert _run(SMALL_CALL_PROBE) == "set True"
    opted_out = _run(SMALL_CALL_PROBE, **{xla_flags.OPT_OUT_ENV: "0"})
    assert opted_out == ("opted out False" if versions.release(jax.__version__) < (0, 12) else "opted out True")


def test_the_library_compiles_at_llvm_o1_on_a_cpu_unless_opted_out():
    import jax

    assert jax.default_backend() == "cpu"
    assert xla_flags.compiler_options({}) == {"xla_backend_optimization_level": 1, "xla_cpu_prefer_vector_width": 512}
    assert xla_flags.compiler_options({xla_flags.OPT_OUT_ENV: "0"}) is None


def test_the_compile_options_leave_an_option_the_users_xla_flags_set_to_the_user():
    users = {"XLA_FLAGS": "--xla_cpu_prefer_vector_width=256 --xla_force_host_platform_device_count=2"}
    assert xla_flags.compiler_options(users) == {"xla_backend_optimization_level": 1}


def test_jsr_jit_and_the_train_step_compile_with_the_librarys_options(monkeypatch):
    # The option changes XLA's LLVM level, which nothing in a compiled program's text shows: check the wiring.
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import jax_scan_rnn as jsr
    from jax_scan_rnn.train import TrainStep

    asked = []
    real = xla_flags.compiler_options
    monkeypatch.setattr(xla_flags, "compiler_options", lambda *a: asked.append(1) or real(*a))
    model = jsr.Traveller(3, 8, 1, rngs=nnx.Rngs(0))
    jsr.jit(model)(jnp.ones((1, 5, 3)))
    assert len(asked) == 1
    TrainStep(model, lambda m, x: (jnp.mean(m(x)[0]), {}), optax.sgd(0.1), jnp.ones((1, 5, 3)))
    assert len(asked) == 2  # once for the optimiser's compiled init and the step
