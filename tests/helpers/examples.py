"""Running the repository's example and benchmark scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_repo_script(
    rel: str, *args: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Runs ``REPO/rel`` with this interpreter and ``args`` to completion
    (bounded by ``timeout``), capturing its output as text."""
    return subprocess.run(
        [sys.executable, str(REPO / rel), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def example_env(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without the variables in ``drop``; when
    ``MOONCAKE_MASTER_BIN`` is not set, it names the ``mooncake_master``
    beside the interpreter, else the one on ``PATH`` (empty when none)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if "MOONCAKE_MASTER_BIN" not in env:
        sib = Path(sys.executable).parent / "mooncake_master"
        env["MOONCAKE_MASTER_BIN"] = (
            str(sib) if sib.exists() else (shutil.which("mooncake_master") or "")
        )
    return env
