"""Every console script this package declares: installed, ``--help`` lists its
flags, and an unknown flag exits 1 naming the flag. Upstream's commands are
all declared (except those listed as pending, with the reason)."""

from __future__ import annotations

import pytest
from conftest import PENDING, UPSTREAM_COMMANDS, command, declared_scripts, run

SCRIPTS = declared_scripts()

# Flags each command's --help must list (upstream's names).
HELP_FLAGS = {
    "mooncake_master": ["-rpc_port", "-enable_http_metadata_server", "-metrics_port"],
    "mooncake_http_metadata_server": ["--port", "--host", "--log-level"],
    "mc_store_rest_server": ["--config", "-D", "--define", "--port", "--max-wait-time"],
    "transfer_engine_topology_dump": [
        "--device-name",
        "--backend",
        "--use-custom-topo",
        "--custom-topo-json",
    ],
    "mooncake_client": ["-host", "-port", "-master_server_address", "-global_segment_size"],
    "transfer_engine_bench": [
        "-mode",
        "-metadata_server",
        "-segment_id",
        "-operation",
        "-block_size",
        "-batch_size",
        "-duration",
        "-threads",
        "-protocol",
    ],
}
# gflags programs exit 1 after --help, as upstream's do.
GFLAGS = {"mooncake_master", "transfer_engine_bench", "mooncake_client"}


def test_upstream_commands_are_declared() -> None:
    missing = [c for c in UPSTREAM_COMMANDS if c not in SCRIPTS and c not in PENDING]
    assert not missing, f"upstream commands without a console script: {missing}"
    assert set(SCRIPTS) - set(UPSTREAM_COMMANDS) == set(), "a command upstream does not have"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_lists_flags(name: str) -> None:
    r = run([command(name), "--help"])
    out = r.stdout + r.stderr
    assert r.returncode == (1 if name in GFLAGS else 0), out
    for flag in HELP_FLAGS.get(name, []):
        assert flag in out, f"{name} --help does not list {flag}:\n{out}"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_unknown_flag_exits_1_naming_it(name: str) -> None:
    r = run([command(name), "--no_such_flag_xyz=1"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no_such_flag_xyz" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("name", "argv", "says"),
    [
        ("mooncake_http_metadata_server", ["--port", "70000"], "--port"),
        ("mooncake_http_metadata_server", ["--port"], "--port"),
        ("mooncake_http_metadata_server", ["--log-level", "LOUD"], "--log-level"),
        ("mc_store_rest_server", ["--port", "x"], "--port"),
        ("mc_store_rest_server", ["--max-wait-time", "soon"], "--max-wait-time"),
        ("transfer_engine_topology_dump", ["--backend", "gpu"], "--backend"),
    ],
)
def test_bad_flag_value_exits_1_naming_the_flag(name: str, argv: list[str], says: str) -> None:
    r = run([command(name), *argv])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert says in r.stderr, r.stderr
