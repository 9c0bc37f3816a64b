"""Where the package's console scripts are, for tests that start them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def console_script(name: str, env_var: str) -> str:
    """The path of console script ``name``: ``$env_var`` when set, else the
    one installed beside this interpreter, else the one on ``PATH``; skips
    the calling test when there is none."""
    env = os.environ.get(env_var)
    if env:
        return env
    sibling = Path(sys.executable).parent / name
    if sibling.exists():
        return str(sibling)
    found = shutil.which(name)
    if found:
        return found
    pytest.skip(f"{name} not found (set {env_var})")
    raise AssertionError("unreachable")
