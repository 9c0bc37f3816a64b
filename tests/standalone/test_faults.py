"""Several dummy processes on one daemon, and the faults of either side: a
dummy whose daemon died gets clean negative codes (no hang, no crash) and
works again after ``setup_dummy`` to the restarted daemon; a dummy that
dies leaves the daemon serving the others, and what it held (mapped
memory, registered buffers, put and get sessions) is reclaimed."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, Dummies, DummyProc, MiB, wait_until

K = Callable[[str], str]


def daemon_stats(s: Any) -> dict[str, int]:
    return {k: int(v) for k, v in s.get_client_stats().items() if k.startswith("daemon_")}


def test_several_dummy_processes_share_one_daemon(
    daemon: Daemon, dummy_procs: Callable[..., DummyProc], dummies: Dummies, key: K
) -> None:
    procs = [dummy_procs(daemon.address) for _ in range(3)]
    for p in procs:
        assert p.call(op="setup", mem_pool_size=16 * MiB, local_buffer_size=4 * MiB) == 0
        assert p.call(op="buffer", name="io", size=2 * MiB) == 0
    results: list[int] = [0] * len(procs)

    def work(i: int) -> None:
        results[i] = procs[i].call(op="rounds", prefix=key(f"p{i}"), n=20, size=256 * 1024, seed=i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [20, 20, 20]
    # Each wrote its own keys through the one daemon; all are visible to all.
    observer = dummies(daemon)
    assert observer.batch_is_exist([key(f"p{i}") + "/19" for i in range(3)]) == [1, 1, 1]
    assert daemon_stats(observer)["daemon_dummies"] == 4
    # Their registered buffers are shared memory, handed over in place.
    stats = procs[0].call(op="stats")
    assert stats["dummy_staged_bytes"] == 0
    assert stats["dummy_shared_bytes"] >= 40 * 256 * 1024


def test_a_dead_dummy_is_reclaimed_and_the_others_go_on(
    daemon: Daemon, dummy_procs: Callable[..., DummyProc], dummies: Dummies, key: K
) -> None:
    survivor = dummies(daemon)
    base = daemon_stats(survivor)
    victim = dummy_procs(daemon.address)
    assert victim.call(op="setup", mem_pool_size=16 * MiB, local_buffer_size=4 * MiB) == 0
    assert victim.call(op="buffer", name="io", size=4 * MiB) == 0
    held, read = key("held"), key("read")
    assert survivor.put(read, b"r" * 4096) == 0
    assert victim.call(op="put_session", keys=[held], sizes=[8192]) == [0]
    assert victim.call(op="get_session", keys=[read]) == [0]
    during = daemon_stats(survivor)
    assert during["daemon_dummies"] == base["daemon_dummies"] + 1
    assert during["daemon_dummy_buffers"] == base["daemon_dummy_buffers"] + 1
    assert during["daemon_dummy_sessions"] == base["daemon_dummy_sessions"] + 2
    # The put session holds the key: nobody else can write it now.
    assert survivor.batch_put_session_start([held], [8192]) != [0]
    victim.kill()
    assert wait_until(lambda: daemon_stats(survivor) == base, 10), daemon_stats(survivor)
    # Its put session was revoked (the key can be written again) and its
    # get session ended; the daemon holds nothing of it any more.
    assert survivor.put(held, b"h" * 8192) == 0
    assert survivor.get(held) == b"h" * 8192
    assert daemon.alive()


def test_a_dead_daemon_gives_clean_codes_then_setup_dummy_works_again(
    master_factory: Any,
    daemon_factory: Callable[..., Daemon],
    dummies: Dummies,
    caplog: Any,
    key: K,
) -> None:
    m = master_factory()
    d = daemon_factory(m)
    s = dummies(d)
    k = key("before")
    assert s.put(k, b"x" * 1000) == 0
    d.kill()
    caplog.set_level(logging.INFO, logger="mooncake.store")
    # Every kind of call answers at once with a negative code.
    assert s.put(key("after"), b"y") == -900
    assert s.get(k) == b""
    assert s.is_exist(k) == -900
    assert s.batch_is_exist([k, k]) == [-900, -900]
    assert s.get_buffer(k) is None
    assert s.health_check() == 2
    assert any("unreachable" in r.getMessage() for r in caplog.records)
    d.restart()
    # Calling the restarted daemon with the old attachment: a clear error.
    caplog.clear()
    assert s.is_exist(k) == -900
    assert any("call setup_dummy again" in r.getMessage() for r in caplog.records)
    # setup_dummy again: it works, and the master kept what the old
    # daemon's segment held only while it lived (the segment died with it).
    assert s.setup_dummy(16 * MiB, 4 * MiB, d.address) == 0
    assert s.put(key("again"), b"z" * 100) == 0
    assert s.get(key("again")) == b"z" * 100
    assert s.health_check() == 0


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped by a signal (state ``T``)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                return False
    return True


def test_a_daemon_that_stops_answering_times_out(
    master_factory: Any,
    daemon_factory: Callable[..., Daemon],
    dummies: Dummies,
    monkeypatch: Any,
    caplog: Any,
    key: K,
) -> None:
    import signal

    monkeypatch.setenv("MC_STANDALONE_TIMEOUT_MS", "300")
    d = daemon_factory(master_factory())
    s = dummies(d)
    k = key("t")
    assert s.put(k, b"x" * 100) == 0
    assert d.proc is not None
    d.proc.send_signal(signal.SIGSTOP)
    try:
        # kill(2) returns once the signal is queued: wait until every thread
        # of the daemon has stopped, so that none answers this call first.
        assert wait_until(lambda: _all_threads_stopped(d.proc.pid), 10)
        caplog.set_level(logging.INFO, logger="mooncake.store")
        assert s.get_size(k) == -901  # RPC_TIMEOUT: no hang on a frozen daemon
        assert any("did not answer within 300 ms" in r.getMessage() for r in caplog.records)
    finally:
        d.proc.send_signal(signal.SIGCONT)
    # The daemon is back: new calls are answered again.
    assert s.get(k) == b"x" * 100
