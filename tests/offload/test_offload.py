"""SSD offload: objects that memory eviction would drop stay on their owner's
disk tier (copied there when they were put, the master's default) and come
back on reads, from the owner and from other clients.

Real masters (``--enable_offload`` or ``--root_fs_dir``) and real clients (this
process and child processes). Each test writes three times the memory it lends
(1 MiB objects into a 16 MiB segment) and reads everything back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Child, Master, ptr, wait_until
from helpers.common import pattern, pattern_array
from helpers.fixtures import closed_at_teardown
from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20
SEG = 16 * MiB
N = 48  # three times the segment
LEASE_MS = 100


def setup_owner(m: Master, path: Path | str, **kw: Any) -> tuple[Any, int]:
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1",
        m.metadata_url,
        kw.pop("global_segment_size", SEG),
        16 * MiB,
        "tcp",
        "",
        m.rpc_addr,
        enable_ssd_offload=True,
        ssd_offload_path=str(path),
    )
    return s, rc


def put_retry(s: Any, key: str, data: bytes, timeout: float = 10.0) -> int:
    """put, retrying NO_AVAILABLE_HANDLE (-200) while eviction frees space."""
    deadline = time.monotonic() + timeout
    while True:
        rc = s.put(key, data)
        if rc != -200 or time.monotonic() >= deadline:
            return rc
        time.sleep(0.005)


def fill(s: Any, prefix: str, n: int = N) -> list[str]:
    keys = [f"{prefix}{i}" for i in range(n)]
    for i, k in enumerate(keys):
        assert put_retry(s, k, pattern(MiB, i)) == 0, k
    return keys


def buckets(d: Path) -> list[Path]:
    return sorted(d.glob("*.bucket"))


def allocated(d: Path) -> int:
    """Bytes allocated to the files in ``d``, as ``du`` counts them; a file
    that goes while it is counted (a bucket evicted, a meta file renamed
    into place) counts as gone."""
    total = 0
    for p in d.iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_blocks * 512
    return total


@pytest.fixture
def offload_master(master_factory: Callable[..., Master]) -> Master:
    return master_factory(default_kv_lease_ttl=LEASE_MS, enable_offload=True, client_ttl=2)


def filled(owner: Callable[..., tuple[Any, int]], d: Path, prefix: str) -> tuple[Any, list[str]]:
    """An owner with its disk tier in ``d`` (its setup must succeed), holding
    the objects ``fill(s, prefix)`` wrote: (store, their keys)."""
    s, rc = owner(d)
    assert rc == 0
    return s, fill(s, prefix)


@pytest.fixture
def owners() -> Iterator[list[Any]]:
    yield from closed_at_teardown()


@pytest.fixture
def owner(offload_master: Master, owners: list[Any]) -> Callable[..., tuple[Any, int]]:
    """``owner(path, **kw)``: ``setup_owner`` on the offload master; closed at teardown."""

    def make(path: Path | str, **kw: Any) -> tuple[Any, int]:
        s, rc = setup_owner(offload_master, path, **kw)
        owners.append(s)
        return s, rc

    return make


@pytest.fixture
def tier(tmp_path: Path) -> Path:
    """An empty directory for a disk tier."""
    d = tmp_path / "tier"
    d.mkdir()
    return d


def stop_daemon(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    proc.kill()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``tmpfs(size_mib, ro=False)`` mounts a small tmpfs (root only; skips otherwise)."""
    mounted: list[Path] = []

    def make(size_mib: int, ro: bool = False) -> Path:
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        opts = f"size={size_mib}m" + (",ro" if ro else "")
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)],
            capture_output=True,
            check=False,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_evicted_objects_read_back_from_disk_on_every_path(
    owner: Callable[..., tuple[Any, int]], tier: Path
) -> None:
    d = tier
    s, keys = filled(owner, d, "k")
    # Three times the memory was written: most objects live on disk now.
    assert buckets(d), "nothing was offloaded"
    assert all(s.is_exist(k) == 1 for k in keys)
    # get
    for i, k in enumerate(keys):
        assert s.get(k) == pattern(MiB, i), k
    # get_into
    out = np.zeros(MiB, np.uint8)
    for i, k in enumerate(keys[:16]):
        assert s.get_into(k, ptr(out), MiB) == MiB
        assert np.array_equal(out, pattern_array(MiB, i)), k
    # batch_get_into
    bufs = [np.zeros(MiB, np.uint8) for _ in range(8)]
    got = s.batch_get_into(keys[:8], [ptr(b) for b in bufs], [MiB] * 8)
    assert got == [MiB] * 8
    for i, b in enumerate(bufs):
        assert np.array_equal(b, pattern_array(MiB, i))
    # batch_get_buffer
    for i, b in enumerate(s.batch_get_buffer(keys[8:12])):
        assert b is not None and bytes(b) == pattern(MiB, 8 + i)
    # a range read (get_into_ranges): bytes 1000..1100 of the first object
    reg = np.zeros(4096, np.uint8)
    assert s.register_buffer(ptr(reg), reg.nbytes) == 0
    r = s.get_into_ranges([ptr(reg)], [[keys[0]]], [[[0]]], [[[1000]]], [[[100]]])
    assert r == [[[100]]], r
    assert bytes(reg[:100]) == pattern(MiB, 0)[1000:1100]
    s.unregister_buffer(ptr(reg))
    # Reads of this client's own tier are local, not served over RPC.
    assert s.get_offload_rpc_read_count() == 0
    # Memory stays used up to its watermark: eviction does not evict again
    # for space its victims are still being copied out of.
    descs = s.batch_get_replica_desc(keys)
    in_memory = sum(1 for ds in descs.values() if ds and ds[0].is_memory_replica())
    assert in_memory >= 8, in_memory
    assert s.get_client_stats()["disk_bytes_read"] > 0


def test_disk_usage_stays_under_the_cap_and_evicted_buckets_are_forgotten(
    owner: Callable[..., tuple[Any, int]], tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tier
    cap = 12 * MiB
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", str(cap))
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "2")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS", "0")
    s, keys = filled(owner, d, "b")
    used = allocated(d)
    assert used <= cap, used
    gone = [i for i, k in enumerate(keys) if s.is_exist(k) == 0]
    # Whole buckets went, the oldest first; the master forgot them.
    assert len(gone) >= 10, gone
    assert max(gone) < N - 8, gone
    for i, k in enumerate(keys):
        if i not in gone:
            v = s.get(k)
            # Evictions the last writes started may still take a bucket
            # meanwhile: then the master has forgotten it too.
            assert v == pattern(MiB, i) or (v == b"" and s.is_exist(k) == 0), k
    assert s.get_client_stats()["disk_evicted_buckets"] > 0


def test_a_remote_client_reads_disk_copies_from_their_owner(
    offload_master: Master,
    owner: Callable[..., tuple[Any, int]],
    child_factory: Callable[..., Child],
    tier: Path,
) -> None:
    d = tier
    s, keys = filled(owner, d, "r")
    reader = child_factory(env={"MC_STORE_SAME_HOST": "off"})
    assert reader.setup(offload_master) == 0
    for i, k in enumerate(keys):
        res = reader.call("check_pattern", key=k, size=MiB, seed=i)
        assert res == {"n": MiB, "match": True}, (k, res)
    assert s.get_offload_rpc_read_count() > 0
    # An owner that serves no disk reads is not needed for memory replicas,
    # but its disk copies then miss; here it serves them.
    reader.stop()


def test_remove_and_remove_all_delete_the_files(
    owner: Callable[..., tuple[Any, int]], tier: Path
) -> None:
    d = tier
    s, keys = filled(owner, d, "x")
    assert buckets(d)
    assert s.remove(keys[0], True) == 0
    assert s.is_exist(keys[0]) == 0
    assert s.get(keys[0]) == b""
    assert s.remove_all(True) == N - 1
    # The owner deletes the files once it processed the removals.
    assert wait_until(lambda: not buckets(d), 10.0), [p.name for p in buckets(d)]
    assert not list(d.glob("*.meta"))


def test_the_upstream_scenario_with_root_fs_dir(
    master_factory: Callable[..., Master], store_factory: Any, tmp_path: Path
) -> None:
    """Upstream's SSD-offload test: the master has --root_fs_dir, the client
    sets up plainly, writes 3x its memory in 1 MiB objects, and reads every
    one back."""
    root = tmp_path / "root"
    m = master_factory(default_kv_lease_ttl=LEASE_MS, root_fs_dir=str(root))
    s = store_factory(m, global_segment_size=SEG)
    keys = fill(s, "u")
    ok = sum(s.get(k) == pattern(MiB, i) for i, k in enumerate(keys))
    assert ok == N
    owner_dir = root / "mooncake_cluster" / "owner-0"
    assert buckets(owner_dir), list(root.rglob("*"))


def test_a_missing_or_unwritable_path_fails_setup_with_nothing_mounted(
    offload_master: Master,
    owner: Callable[..., tuple[Any, int]],
    tmp_path: Path,
    tmpfs: Callable[..., Path],
) -> None:
    before = offload_master.segments()
    s, rc = owner(tmp_path / "missing")
    assert rc != 0
    assert offload_master.segments() == before
    assert s.put("k", b"v") != 0  # not set up
    f = tmp_path / "a-file"
    f.write_bytes(b"x")
    _, rc2 = owner(f)
    assert rc2 != 0
    ro = tmpfs(1, ro=True)
    _, rc3 = owner(ro)
    assert rc3 != 0
    assert offload_master.segments() == before


def test_two_owners_on_one_directory_are_refused(
    offload_master: Master, owner: Callable[..., tuple[Any, int]], tmp_path: Path
) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    a, rc = owner(d)
    assert rc == 0
    segs = offload_master.segments()
    _, rc2 = owner(d)
    assert rc2 != 0
    assert offload_master.segments() == segs
    # The first owner is unaffected.
    assert a.put("still", b"here") == 0 and a.get("still") == b"here"


def start_daemon(
    m: Master, tmp_path: Path, env: dict[str, str], *extra: str
) -> tuple[Any, Path, int]:
    """A real ``mooncake_client`` daemon (SSD offload on); its process, log and port."""
    exe = Path(sys.executable).parent / "mooncake_client"
    if not exe.exists():
        pytest.skip("mooncake_client not found next to the interpreter")
    log = tmp_path / f"daemon-{time.monotonic_ns()}.log"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        str(exe),
        "--host=127.0.0.1",
        f"--port={port}",
        "--global_segment_size=16MB",
        f"--master_server_address={m.rpc_addr}",
        f"--metadata_server={m.metadata_url}",
        "--enable_offload=true",
        *extra,
    ]
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
        )
    ok = wait_until(
        lambda: (
            "serving dummy clients" in log.read_text(errors="replace") or proc.poll() is not None
        ),
        20.0,
    )
    if not ok or proc.poll() is not None:
        proc.kill()
        raise AssertionError(f"daemon did not come up:\n{log.read_text(errors='replace')[-3000:]}")
    return proc, log, port


def test_a_full_disk_degrades_to_plain_eviction(
    master_factory: Callable[..., Master],
    store_factory: Any,
    tmpfs: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """The owner is a ``mooncake_client --enable_offload`` daemon whose disk
    tier is an 8 MiB tmpfs (the cap above it, so the disk itself fills); a
    client without memory of its own writes 3x the daemon's memory and reads
    everything back through the daemon's disk tier."""
    m = master_factory(default_kv_lease_ttl=LEASE_MS, enable_offload=True)
    fs = tmpfs(8)
    env = {
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(fs),
        "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(1 << 30),
    }
    proc, log, _ = start_daemon(m, tmp_path, env)
    try:
        s = store_factory(m, global_segment_size=0)
        for i in range(N):
            assert put_retry(s, f"f{i}", pattern(MiB, i)) == 0, i
        got = [s.get(f"f{i}") for i in range(N)]
        good = sum(v == pattern(MiB, i) for i, v in enumerate(got))
        # Never a wrong value: an object reads back whole or not at all.
        assert all(v == pattern(MiB, i) or v == b"" for i, v in enumerate(got))
        assert 0 < good < N, good
        assert proc.poll() is None, "the daemon died"
        assert s.put("after", b"still works") == 0 and s.get("after") == b"still works"
        text = log.read_text(errors="replace")
        assert text.count("disk tier full") == 1, text[-3000:]
    finally:
        stop_daemon(proc)


def test_a_daemon_that_serves_no_disk_reads_gives_misses_never_bytes(
    master_factory: Callable[..., Master], store_factory: Any, tmp_path: Path, tier: Path
) -> None:
    d = tier
    m = master_factory(default_kv_lease_ttl=LEASE_MS, enable_offload=True)
    env = {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(d)}
    proc, _, _ = start_daemon(m, tmp_path, env, "--start_offload_rpc_server=false")
    try:
        s = store_factory(m, global_segment_size=0)
        for i in range(N):
            assert put_retry(s, f"w{i}", pattern(MiB, i)) == 0, i
        assert buckets(d), "the daemon offloaded nothing"
        got = [s.get(f"w{i}") for i in range(N)]
        assert all(v == pattern(MiB, i) or v == b"" for i, v in enumerate(got))
        # Memory replicas read; disk copies are not served to other processes.
        assert 0 < sum(v != b"" for v in got) <= 16
        assert all(s.is_exist(f"w{i}") == 1 for i in range(N))
    finally:
        stop_daemon(proc)


def test_a_corrupted_bucket_reads_as_an_error_never_wrong_bytes(
    owner: Callable[..., tuple[Any, int]], tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tier
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "4")
    s, keys = filled(owner, d, "c")
    sealed = [p for p in buckets(d) if p.with_suffix(".meta").exists()]
    assert sealed
    victim = sealed[0]
    meta = victim.with_suffix(".meta").read_text().split("\n")
    assert meta[0] == "MCOFFLOAD-META 1"
    in_victim = {e["key"] for e in json.loads(meta[1])["entries"]}
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        f.write(b"\x00garbage\xff" * 64)
    bad = 0
    for i, k in enumerate(keys):
        v = s.get(k)
        if v != pattern(MiB, i):
            assert v == b"", k  # an error (empty), never other bytes
            assert k in in_victim, k
            bad += 1
    assert bad >= 1
    # The damaged bucket is dropped and the master forgot its objects.
    assert not victim.exists()
    for k in keys:
        assert s.is_exist(k) == (0 if k in in_victim else 1), k


def test_an_owner_restarted_with_its_old_directory_serves_it_again(
    offload_master: Master, child_factory: Callable[..., Child], tier: Path
) -> None:
    d = tier
    env = {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "4"}
    a = child_factory(env=env)
    args = {"global_segment_size": SEG, "enable_ssd_offload": True, "ssd_offload_path": str(d)}
    assert a.setup(offload_master, **args) == 0
    for i in range(N):
        assert a.call("put_pattern_retry", key=f"o{i}", size=MiB, seed=i) == 0
    a.stop()  # a clean exit: every bucket is sealed
    b = child_factory(env=env)
    assert b.setup(offload_master, **args) == 0
    results = [b.call("check_pattern", key=f"o{i}", size=MiB, seed=i) for i in range(N)]
    # Whatever was on disk is back; what was in the old owner's memory is gone.
    back = [i for i, r in enumerate(results) if r["match"]]
    assert all(r["match"] or r["n"] < 0 for r in results)
    assert len(back) >= N - SEG // MiB, len(back)
    # Killed mid-run: what comes back is whole, the open bucket is dropped.
    for i in range(N, N + 20):
        assert b.call("put_pattern_retry", key=f"o{i}", size=MiB, seed=i) == 0
    b.kill(signal.SIGKILL)
    name_gone = wait_until(lambda: len(offload_master.segments()) == 0, 15.0)
    assert name_gone, offload_master.segments()
    c = child_factory(env=env)
    assert c.setup(offload_master, **args) == 0
    results = [c.call("check_pattern", key=f"o{i}", size=MiB, seed=i) for i in range(N + 20)]
    assert all(r["match"] or r["n"] < 0 for r in results), results
    assert any(r["match"] for r in results)
    c.stop()
    assert os.path.isdir(d)


def test_an_owner_expired_and_back_brings_none_of_its_disk_copies_back(
    offload_master: Master, child_factory: Callable[..., Child], store_factory: Any, tier: Path
) -> None:
    """An owner paused (SIGSTOP) past the client TTL is expired: the master
    drops its objects, disk copies included, and their keys are free to be
    written again or to stay absent. When it resumes it remounts empty and
    deletes its disk copies instead of announcing them: none of its old
    objects comes back, neither over the newer value of a key written
    meanwhile nor where the key stayed absent."""
    a = child_factory()
    args = {"global_segment_size": SEG, "enable_ssd_offload": True, "ssd_offload_path": str(tier)}
    assert a.setup(offload_master, **args) == 0
    for i in range(4):
        assert a.call("put_pattern", key=f"x{i}", size=4096, seed=i) == 0
    # Written through to its disk tier.
    assert wait_until(lambda: a.call("stats")["disk_objects"] == 4, 15.0), a.call("stats")
    b = store_factory(offload_master)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        expired = wait_until(lambda: len(offload_master.segments()) == 1, 15.0)
        assert expired, offload_master.segments()
        assert b.is_exist("x1") == 0
        assert b.put("x0", b"newer") == 0
    finally:
        os.kill(a.pid, signal.SIGCONT)
    # It remounts, and empties its tier.
    assert wait_until(lambda: len(offload_master.segments()) == 2, 15.0)
    assert wait_until(lambda: a.call("stats")["disk_objects"] == 0, 15.0), a.call("stats")
    assert b.get("x0") == b"newer"
    assert [b.is_exist(f"x{i}") for i in range(1, 4)] == [0, 0, 0]
    assert b.put("x1", b"again") == 0 and b.get("x1") == b"again"


@pytest.mark.parametrize("form", ["keywords", "positional", "dict"])
def test_upstreams_setup_call_forms_turn_offload_on(
    offload_master: Master, owners: list[Any], tmp_path: Path, form: str
) -> None:
    d = tmp_path / "nvme"
    d.mkdir()
    m = offload_master
    s = MooncakeDistributedStore()
    owners.append(s)
    if form == "keywords":
        rc = s.setup(
            local_hostname="127.0.0.1",
            metadata_server=m.metadata_url,
            global_segment_size=16 * 1024 * 1024,
            local_buffer_size=16 * 1024 * 1024,
            protocol="tcp",
            rdma_devices="",
            master_server_addr=m.rpc_addr,
            enable_ssd_offload=True,
            ssd_offload_path=str(d),
        )
    elif form == "positional":
        rc = s.setup(
            "127.0.0.1", m.metadata_url, SEG, 16 * MiB, "tcp", "", m.rpc_addr, None, True, str(d)
        )
    else:
        rc = s.setup(
            {
                "local_hostname": "127.0.0.1",
                "metadata_server": m.metadata_url,
                "master_server_addr": m.rpc_addr,
                "global_segment_size": SEG,
                "enable_ssd_offload": True,
                "ssd_offload_path": str(d),
            }
        )
    assert rc == 0
    keys = fill(s, form)
    assert buckets(d)
    assert all(s.get(k) == pattern(MiB, i) for i, k in enumerate(keys))


def test_a_dummy_client_reads_disk_copies_through_its_daemon(
    master_factory: Callable[..., Master], owners: list[Any], tmp_path: Path, tier: Path
) -> None:
    d = tier
    m = master_factory(default_kv_lease_ttl=LEASE_MS, enable_offload=True)
    proc, _, port = start_daemon(m, tmp_path, {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(d)})
    try:
        dummy = MooncakeDistributedStore()
        owners.append(dummy)
        assert dummy.setup_dummy(64 * MiB, 16 * MiB, f"127.0.0.1:{port}") == 0
        keys = fill(dummy, "dm")
        assert buckets(d), "the daemon offloaded nothing"
        assert all(dummy.is_exist(k) == 1 for k in keys)
        assert all(dummy.get(k) == pattern(MiB, i) for i, k in enumerate(keys))
    finally:
        with contextlib.suppress(Exception):
            dummy.close()
        stop_daemon(proc)
