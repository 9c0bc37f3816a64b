"""The wheel a user ships: ``maturin build --release`` makes one abi3 wheel
(cp310-abi3: Python 3.10 and later) with every console script; installed
into a fresh venv (not the editable one the suites use), its commands run
and the demo workload (``examples/demo.py``: a master and two client
processes) passes against it.

The build reuses the release artifacts of ``maturin develop --release``
(scripts/env.sh), so it takes seconds; ``MOONCAKE_WHEEL`` names a built
wheel to test instead."""

from __future__ import annotations

import os
import re
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, declared_scripts, run

SCRIPTS = declared_scripts()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("MOONCAKE_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheels")
    # As if this venv were activated (as when env.sh built the extension),
    # so cargo finds the release artifacts fresh.
    env = {
        **os.environ,
        "VIRTUAL_ENV": sys.prefix,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    r = run(
        [sys.executable, "-m", "maturin", "build", "--release", "--out", str(out)],
        timeout=3600,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    r = run([base, "-m", "venv", str(venv)], timeout=300)
    assert r.returncode == 0, r.stderr
    r = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv


def test_one_abi3_wheel_with_every_command(wheel: Path) -> None:
    assert re.fullmatch(r"mooncake_rs-[^-]+-cp310-abi3-[a-z0-9_.]+\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "mooncake/_native.abi3.so" in names
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = z.read(info).decode()
        metadata = z.read(info.replace("entry_points.txt", "METADATA")).decode()
    for name, target in SCRIPTS.items():
        assert f"{name}={target}" in entry_points.replace(" ", ""), entry_points
    assert "Requires-Python: >=3.10" in metadata


def test_fresh_venv_runs_every_command(fresh_venv: Path) -> None:
    for name in SCRIPTS:
        exe = fresh_venv / "bin" / name
        assert exe.exists(), name
        r = run([str(exe), "--help"], cwd="/")
        assert r.returncode in (0, 1) and "--" in r.stdout + r.stderr, (name, r.stderr)
        r = run([str(exe), "--no_such_flag_xyz"], cwd="/")
        assert r.returncode == 1 and "no_such_flag_xyz" in r.stderr, (name, r.stderr)


def test_demo_against_the_wheel(fresh_venv: Path, tmp_path: Path) -> None:
    py = str(fresh_venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_MASTER_BIN", "PYTHONPATH")}
    env["PATH"] = f"{fresh_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    where = run(
        [py, "-c", "import mooncake._native as n; print(n.__file__)"], cwd=tmp_path, env=env
    )
    assert where.stdout.startswith(str(fresh_venv)), where.stdout + where.stderr
    r = run([py, str(REPO / "examples" / "demo.py")], timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo OK" in r.stdout, r.stdout
    assert "reader (same-host)" in r.stdout and "reader (tcp)" in r.stdout, r.stdout
