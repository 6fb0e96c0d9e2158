"""The command line: version, info, the parity self-check, and one-line errors with exit code 2."""
from __future__ import annotations

import subprocess
import sys

import pytest

from jax_scan_rnn import __version__
from jax_scan_rnn.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jax-scan-rnn {__version__}"


def test_info_lists_devices_and_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("jax ", "flax", "devices", "torch", "xla small-loop setting"):
        assert key in out


def test_check_passes(capsys):
    assert main(["check", "--steps", "50"]) == 0
    assert "PASSED" in capsys.readouterr().out


def test_unknown_command_exits_2():
    result = subprocess.run([sys.executable, "-m", "jax_scan_rnn.cli", "frobnicate"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
@pytest.mark.parametrize("argv, flag", [(["sample", "vae", "--checkpoint", "nowhere", "--temperature"], "--temperature"),
                                         (["train", "traveller", "--lr"], "--lr")])
def test_non_positive_or_non_finite_floats_are_refused_before_any_work(argv, flag, value, capsys):
    """One line naming the flag, exit code 2: nothing is loaded or trained with such a value."""
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: expected a finite number > 0, got {value}" in capsys.readouterr().err
