"""``transfer_engine_bench``: a target and an initiator process against each
other (upstream's flags; found by ``P2PHANDSHAKE`` or through the standalone
HTTP metadata server), upstream's closing line, and the bad cases: a segment
that does not exist or is too small ends with a clear error and exit 1, at
once."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest
from conftest import Proc, command, free_port, run, wait_port

DONE = re.compile(
    r"Test completed: duration (\d+\.\d\d), batch count (\d+), throughput (\d+\.\d+) (\S+)/s"
)
SMALL = ["--block_size=4096", "--batch_size=4", "--threads=2", "--buffer_size=1048576"]


def bench(*flags: str) -> list[str]:
    return [command("transfer_engine_bench"), "--protocol=tcp", *flags]


def p2p_initiator(segment: str, *flags: str) -> list[str]:
    """An initiator on 127.0.0.1 that finds ``segment`` by ``P2PHANDSHAKE``."""
    return bench(
        "--mode=initiator",
        "--metadata_server=P2PHANDSHAKE",
        "--local_server_name=127.0.0.1",
        f"--segment_id={segment}",
        *flags,
    )


def start_target(spawn: Any, *flags: str) -> tuple[Proc, str]:
    """A target; returns it and its segment name (from its first line)."""
    p = spawn(bench("--mode=target", "--local_server_name=127.0.0.1", *SMALL, *flags))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"target: segment (\S+),", p.text())
        if m:
            return p, m.group(1)
        assert p.p.poll() is None, p.text()
        time.sleep(0.05)
    raise AssertionError(f"target did not start:\n{p.text()}")


@pytest.mark.parametrize("operation", ["read", "write"])
def test_initiator_against_a_target(spawn: Any, operation: str) -> None:
    target, segment = start_target(spawn, "--metadata_server=P2PHANDSHAKE")
    r = run(
        p2p_initiator(
            segment,
            f"--operation={operation}",
            "--duration=1",
            "--report_unit=MiB",
            "--report_precision=3",
            *SMALL,
        ),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    m = DONE.search(r.stderr)
    assert m, r.stderr
    duration, batches, rate, unit = float(m[1]), int(m[2]), m[3], m[4]
    assert duration >= 1.0 and batches > 0 and unit == "MiB"
    assert len(rate.split(".")[1]) == 3
    # What the line reports is what moved: batches x 4 blocks x 4 KiB.
    assert float(rate) == pytest.approx(batches * 4 * 4096 / duration / (1 << 20), rel=0.01)
    target.signal(signal.SIGTERM)
    assert target.wait(timeout=20) == 0


def test_through_the_http_metadata_server(spawn: Any) -> None:
    port = free_port()
    meta = spawn(
        [command("mooncake_http_metadata_server"), "--host", "127.0.0.1", "--port", str(port)]
    )
    wait_port(port, meta)
    url = f"--metadata_server=http://127.0.0.1:{port}/metadata"
    name = f"127.0.0.1:{free_port()}"
    target = spawn(bench("--mode=target", f"--local_server_name={name}", url, *SMALL))
    deadline = time.monotonic() + 30
    while "target: segment" not in target.text():
        assert time.monotonic() < deadline and target.p.poll() is None, target.text()
        time.sleep(0.05)
    r = run(
        bench(
            "--mode=initiator",
            url,
            f"--local_server_name=127.0.0.1:{free_port()}",
            f"--segment_id={name}",
            "--duration=1",
            *SMALL,
        ),
        timeout=120,
    )
    assert r.returncode == 0 and DONE.search(r.stderr), r.stderr


def test_a_segment_that_does_not_exist_fails_at_once(spawn: Any) -> None:
    # Nobody listens there (P2PHANDSHAKE names a segment by its RPC address).
    missing = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = run(
        p2p_initiator(
            missing,
            "--duration=30",
            *SMALL,
        ),
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert f'Unable to get target segment "{missing}"' in r.stderr, r.stderr
    assert "Test completed" not in r.stderr
    assert time.monotonic() - t0 < 30  # not the --duration: before any transfer
    # An unknown name on a metadata server: the same.
    port = free_port()
    meta = spawn(
        [command("mooncake_http_metadata_server"), "--host", "127.0.0.1", "--port", str(port)]
    )
    wait_port(port, meta)
    r = run(
        bench(
            "--mode=initiator",
            f"--metadata_server=http://127.0.0.1:{port}/metadata",
            f"--local_server_name=127.0.0.1:{free_port()}",
            "--segment_id=no-such-segment",
            "--duration=30",
            *SMALL,
        ),
        timeout=60,
    )
    assert r.returncode == 1 and 'segment "no-such-segment"' in r.stderr, r.stderr


def test_a_segment_too_small_for_the_run_fails_at_once(spawn: Any) -> None:
    _, segment = start_target(spawn, "--metadata_server=P2PHANDSHAKE")
    r = run(
        p2p_initiator(
            segment,
            "--duration=30",
            "--block_size=1048576",
            "--batch_size=4",
            "--threads=2",
        ),
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert "this run needs 8388608" in r.stderr, r.stderr


def test_bad_flags_exit_1_saying_why() -> None:
    for flags, says in [
        (["--mode=both"], "Unsupported mode"),
        (["--operation=copy"], "Unsupported operation"),
        (["--protocol=nvlink"], "GPU/NPU memory"),
        (["--threads=0"], "'threads'"),
        (["--block_size=x"], "block_size"),
    ]:
        r = run([command("transfer_engine_bench"), *flags])
        assert r.returncode == 1 and says in r.stderr, (flags, r.stderr)
