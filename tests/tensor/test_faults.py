"""Tensor IO under faults and across processes.

What survives a failed shard write, corrupted or inconsistent stored objects,
reads from another process on this host (mapped path) and over forced TCP,
leases and the local-buffer cap.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import rpcs, stored_keys
from mooncake.store import DP, TP, ReadTarget, TensorParallelism

torch = pytest.importorskip("torch")

MiB = 1 << 20
HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def P(*axes):
    return TensorParallelism(list(axes))


def test_failed_shard_revokes_its_manifest(master_factory, store_factory, logs):
    # no eviction: a failed allocation would otherwise evict what this test checks
    m = master_factory(eviction_ratio=0)
    s = store_factory(m, global_segment_size=1 * MiB, local_buffer_size=1 * MiB)
    big = torch.zeros(2 * MiB // 4)
    assert s.put_tensor_with_parallelism("big", big, P(TP(0, 2, 0))) == -200
    logs.expect("put_tensor_with_parallelism", "NO_AVAILABLE_HANDLE")
    assert stored_keys(m, "big") == []
    small = torch.ones(64)
    res = s.batch_put_tensor_with_parallelism(
        ["big", "small"], [big, small], [P(TP(0, 2, 0)), P(TP(1, 2, 0))]
    )
    assert res == [-200, 0]
    logs.expect("batch_put_tensor_with_parallelism", "1 of 2 items failed")
    assert stored_keys(m, "big") == []
    assert stored_keys(m, "small") == ["small__parallelism_manifest", "small_tp_1"]
    # a failed write of a legacy TP set keeps the shards that succeeded out of a
    # too-big total, reporting the first failure
    assert s.put_tensor_with_tp("tpset", torch.zeros(2, 200 * 1024), 0, 2, 0) < 0
    logs.expect("put_tensor_with_tp")


def test_corrupted_stored_header_reads_none(tstore, key, full, logs):
    k = key("A")
    for r in range(2):
        assert tstore.put_tensor_with_parallelism(k, full[2 * r : 2 * r + 2], P(TP(r, 2, 0))) == 0
    raw = bytearray(tstore.get(f"{k}_tp_1"))
    raw[0] ^= 0xFF
    assert tstore.upsert(f"{k}_tp_1", bytes(raw)) == 0
    assert tstore.get_tensor(f"{k}_tp_1") is None
    logs.expect("get_tensor", "bad magic")
    assert tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")) is None
    logs.expect("get_tensor_with_parallelism", "bad magic")
    raw[0] ^= 0xFF
    raw[12] = 9  # ndim 9
    assert tstore.upsert(f"{k}_tp_1", bytes(raw)) == 0
    assert tstore.get_tensor_with_tp(k, 1, 2) is None
    logs.expect("get_tensor_with_tp", "ndim")
    buf = torch.zeros(4096, dtype=torch.uint8)
    assert tstore.get_tensor_into(f"{k}_tp_1", buf.data_ptr(), 4096) is None
    logs.expect("get_tensor_into", "ndim")


def test_shards_that_disagree_read_none(tstore, key, full, logs):
    k = key("D")
    assert tstore.put_tensor_with_parallelism(k, full[:2], P(TP(0, 2, 0))) == 0
    assert tstore.put_tensor_with_parallelism(k, full[2:].double(), P(TP(1, 2, 0))) == 0
    assert tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")) is None
    logs.expect("get_tensor_with_parallelism", "dtype")
    # re-sharding fails; rank 3 has no raw K_tp_3 chunk to fall back to (S5)
    assert tstore.get_tensor_with_tp(k, 3, 4) is None
    logs.expect("get_tensor_with_tp", "dtype")
    # rank 0 of 4 needs only K_tp_0, which is consistent: the requested rows
    assert torch.equal(tstore.get_tensor_with_tp(k, 0, 4), full[:1])
    # a TP=3 split the extent does not divide falls back to the raw stored
    # chunk (upstream's last resort, legacy wrappers only)
    assert torch.equal(tstore.get_tensor_with_tp(k, 0, 3), full[:2])
    assert tstore.get_tensor_with_parallelism(k, ReadTarget("shard", P(TP(0, 3, 0)))) is None
    logs.expect("get_tensor_with_parallelism", "3 equal parts")
    g = key("G")
    assert tstore.put_tensor_with_parallelism(g, full[:2], P(TP(0, 2, 0))) == 0
    assert tstore.put_tensor_with_parallelism(g, torch.ones(3, 6), P(TP(1, 2, 0))) == 0
    assert tstore.get_tensor_with_parallelism(g, ReadTarget("full", P(TP(0, 2, 0)))) is None
    logs.expect("get_tensor_with_parallelism")


def test_missing_member_full_read_none(tstore, key, full, logs):
    k = key("M")
    assert tstore.put_tensor_with_tp(k, full, 0, 3, 1) == 0
    assert tstore.remove(f"{k}_tp_1", True) == 0
    assert tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")) is None
    logs.expect("get_tensor_with_parallelism", "OBJECT_NOT_FOUND")
    got = tstore.get_tensor_with_parallelism(k, ReadTarget("shard", P(TP(2, 3, 1))))
    assert torch.equal(got, full[:, 4:6])


def test_tensor_reads_grant_leases(master_factory, store_factory, full):
    m = master_factory(default_kv_lease_ttl=5000)
    s = store_factory(m)
    assert s.put_tensor_with_tp("L", full, 0, 2, 0) == 0
    assert s.remove("L_tp_0") == 0  # a put grants no lease
    assert s.put_tensor_with_tp("L2", full, 0, 2, 0) == 0
    assert torch.equal(s.get_tensor_with_tp("L2", 1, 2), full[2:])
    assert s.remove("L2_tp_1") == -706


def test_remove_all_sees_tensor_objects(master_factory, store_factory, full):
    m = master_factory()
    s = store_factory(m)
    assert s.put_tensor_with_parallelism("R", full, P(TP(0, 2, 0), DP(0, 2))) == 0
    assert s.put_tensor("F", full) == 0
    assert s.remove_all(True) == 3
    assert s.get_tensor("F") is None


def test_reads_are_not_capped_by_the_local_buffer(store_factory, key):
    s = store_factory(global_segment_size=64 * MiB, local_buffer_size=1 * MiB)
    t = torch.arange(MiB, dtype=torch.float32)
    assert s.put_tensor(key("big"), t) == 0
    assert s.get(key("big")) == b""  # the staged byte read is capped
    assert torch.equal(s.get_tensor(key("big")), t)
    assert torch.equal(s.batch_get_tensor([key("big")])[0], t)


def _writer(m, key: str, rows: int, cols: int, tp: int, env: dict[str, str] | None = None):
    import os

    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.Popen(
        [
            sys.executable,
            str(HELPERS / "tensor_writer.py"),
            m.metadata_url,
            m.rpc_addr,
            key,
            str(rows),
            str(cols),
            str(tp),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=full_env,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    info = json.loads(line)
    assert info.get("rc") == [0] * tp, info
    return p


def _stop(p) -> None:
    assert p.stdin is not None
    p.stdin.close()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@pytest.mark.parametrize("same_host", ["auto", "off"])
def test_reads_from_another_process(master_factory, store_factory, monkeypatch, same_host):
    m = master_factory(default_kv_lease_ttl=5000)
    rows, cols, tp = 4096, 1024, 4  # 16 MiB: large copies are split over threads
    writer = _writer(m, "W", rows, cols, tp)
    try:
        monkeypatch.setenv("MC_STORE_SAME_HOST", same_host)
        reader = store_factory(m, global_segment_size=0)
        full = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
        s0 = reader.get_client_stats()
        got = reader.get_tensor_with_parallelism("W", ReadTarget(mode="full"))
        assert torch.equal(got, full)
        got = reader.get_tensor_with_tp("W", 1, 2)
        assert torch.equal(got, full[rows // 2 :])
        got = reader.get_tensor_with_parallelism("W", ReadTarget("shard", P(TP(3, 8, 0))))
        assert torch.equal(got, full[3 * rows // 8 : 4 * rows // 8])
        # A dim-1 box of the dim-0 set: per stored shard one set of strided
        # rows (512 of every 4096 bytes), mapped or over TCP.
        got = reader.get_tensor_with_parallelism("W", ReadTarget("shard", P(TP(5, 8, 1))))
        assert torch.equal(got, full[:, 5 * cols // 8 : 6 * cols // 8])
        s1 = reader.get_client_stats()
        payload = full.numel() * 4 * (1 + 1 / 2 + 1 / 8 + 1 / 8)
        mapped = s1["bytes_read_same_host"] - s0["bytes_read_same_host"]
        tcp = s1["bytes_read_tcp"] - s0["bytes_read_tcp"]
        moved = mapped + tcp
        assert payload <= moved <= payload * 1.05 + 64 * 1024
        if same_host == "auto":
            assert tcp == 0 and mapped > 0
        else:
            assert mapped == 0 and tcp > 0
        before = rpcs(reader)
        many = reader.batch_get_tensor_with_parallelism(
            ["W"] * 16, [ReadTarget("shard", P(TP(i % 4, 4, 0))) for i in range(16)]
        )
        assert rpcs(reader) - before <= 3
        for i, g in enumerate(many):
            r = i % 4
            assert torch.equal(g, full[r * rows // 4 : (r + 1) * rows // 4])
    finally:
        _stop(writer)


def test_gil_released_while_a_read_waits_and_leases_are_refreshed(
    master_factory, store_factory, monkeypatch
):
    """A tensor read blocked on a stopped TCP owner leaves the GIL to other
    threads; once the owner resumes, the expired probe lease is refreshed
    (a third master RPC) and the read returns the right tensor."""
    import os
    import signal
    import threading

    m = master_factory(default_kv_lease_ttl=300)
    rows, cols, tp = 64, 256, 4
    writer = _writer(m, "S", rows, cols, tp)
    try:
        monkeypatch.setenv("MC_FORCE_TCP", "1")
        reader = store_factory(m, global_segment_size=0)
        full = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
        os.kill(writer.pid, signal.SIGSTOP)
        result: list = []
        before = rpcs(reader)
        t = threading.Thread(
            target=lambda: result.append(
                reader.get_tensor_with_parallelism("S", ReadTarget(mode="full"))
            )
        )
        t.start()
        ticks = 0
        deadline = time.monotonic() + 1.0  # longer than the 300 ms lease
        while time.monotonic() < deadline:
            ticks += 1
        assert t.is_alive(), "the read cannot finish while its owner is stopped"
        assert ticks > 0
        os.kill(writer.pid, signal.SIGCONT)
        t.join(timeout=60)
        assert not t.is_alive()
        assert result and torch.equal(result[0], full)
        # probe lookup, member lookup, lease refresh
        assert rpcs(reader) - before == 3
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        _stop(writer)


def test_batched_tensor_writes_with_a_cluster_token(token_owner, store_factory):
    """With a cluster token every TCP write needs the master's ticket for its
    range; a batch whose shards land in one owner's segment is still written
    (one ticketed request per replica) and reads back byte-exact."""
    m, _owner = token_owner("tensor batch token\n")
    s = store_factory(m, global_segment_size=0)
    full = torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48)
    keys = [f"tok{i}" for i in range(4)]
    rcs = s.batch_put_tensor_with_parallelism(
        keys, [full] * 4, [P(DP(0, 2), TP(i, 4, 1)) for i in range(4)]
    )
    assert rcs == [0, 0, 0, 0]
    assert s.put_tensor_with_tp("tokG", full, 0, 4, 0) == 0
    for i, k in enumerate(keys):
        got = s.get_tensor_with_parallelism(k, ReadTarget("shard", P(DP(0, 2), TP(i, 4, 1))))
        assert torch.equal(got, full[:, i * 12 : (i + 1) * 12])
    got = s.get_tensor_with_parallelism("tokG", ReadTarget(mode="full"))
    assert torch.equal(got, full)
    assert s.get_client_stats()["bytes_written_tcp"] > 0
