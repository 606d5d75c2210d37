"""The GPU scripts need a GPU to run; here, bash reads them (a syntax error fails CI, not the GPU run)."""

import os
import subprocess

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(SCRIPTS) if f.endswith(".sh")))
def test_script_parses(name):
    proc = subprocess.run(["bash", "-n", os.path.join(SCRIPTS, name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
