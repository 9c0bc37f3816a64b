"""``transfer_engine_topology_dump``: upstream's line and JSON shape, the
engine's memory locations (one ``cpu:N`` per NUMA node), custom topology
files, and its errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import command, run

PREFIX = "Local topology [te/discover]: "


def numa_nodes() -> list[int]:
    nodes = (
        [
            int(n[4:])
            for n in os.listdir("/sys/devices/system/node")
            if n.startswith("node") and n[4:].isdigit()
        ]
        if os.path.isdir("/sys/devices/system/node")
        else []
    )
    return sorted(nodes) or [0]


def test_discover_prints_upstreams_line_and_json() -> None:
    r = run(
        [command("transfer_engine_topology_dump")], env={**os.environ, "MC_CUSTOM_TOPO_JSON": "x"}
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(PREFIX), r.stdout
    topo = json.loads(r.stdout[len(PREFIX) :])
    assert topo == {f"cpu:{n}": [[], []] for n in numa_nodes()}
    # jsoncpp's styled layout, as upstream prints it.
    assert '\t"cpu:0" : \n\t[\n\t\t[],\n\t\t[]\n\t]' in r.stdout


def test_custom_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "topo.json"
    path.write_text('{"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cuda:0": [["mlx5_1"], []]}')
    r = run([command("transfer_engine_topology_dump"), "--custom-topo-json", str(path)])
    assert r.returncode == 0, r.stderr
    assert r.stdout == (
        f"Local topology [te/custom ({path})]: "
        '{\n\t"cpu:0" : \n\t[\n\t\t[],\n\t\t[]\n\t],\n\t"cuda:0" : \n\t[\n\t\t[],\n\t\t[]\n\t]\n}\n\n'
    )
    env = {**os.environ, "MC_CUSTOM_TOPO_JSON": str(path)}
    r = run([command("transfer_engine_topology_dump"), "--use-custom-topo"], env=env)
    assert r.returncode == 0 and '"cuda:0"' in r.stdout, r.stdout
    # An unreadable file falls back to discovery (as upstream).
    missing = tmp_path / "missing.json"
    r = run([command("transfer_engine_topology_dump"), "--custom-topo-json", str(missing)])
    assert r.returncode == 0 and '"cuda:0"' not in r.stdout and '"cpu:0"' in r.stdout


def test_use_custom_topo_without_a_file_exits_1() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MC_CUSTOM_TOPO_JSON"}
    r = run([command("transfer_engine_topology_dump"), "--use-custom-topo"], env=env)
    assert r.returncode == 1
    assert "--use-custom-topo requires MC_CUSTOM_TOPO_JSON" in r.stderr


def test_backends_and_device_filter() -> None:
    r = run([command("transfer_engine_topology_dump"), "--backend", "tent"])
    assert r.returncode == 0 and r.stdout.startswith("Local topology [tent/discover]: ")
    env = {**os.environ, "MC_USE_TENT": "1"}
    r = run([command("transfer_engine_topology_dump")], env=env)
    assert r.stdout.startswith("Local topology [tent/discover]: ")
    r = run([command("transfer_engine_topology_dump"), "--device-name", "mlx5_0,mlx5_1"])
    assert r.returncode == 0
    assert json.loads(r.stdout[len(PREFIX) :]) == {f"cpu:{n}": [[], []] for n in numa_nodes()}
