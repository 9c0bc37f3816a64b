"""Copy and move tasks: ``create_copy_task``, ``create_move_task`` and
``query_task`` with upstream's signatures, codes and results, against a
real master and three segment-owning clients (the shape of upstream's
``scripts/test_copy_move_api.py``)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from conftest import Master, StoreFactory
from helpers.replicate import replicate_config

MiB = 1 << 20


def _wait(store: Any, task_id: Any, timeout: float = 20.0) -> Any:
    from mooncake.store import TaskStatus

    deadline = time.monotonic() + timeout
    while True:
        resp, err = store.query_task(task_id)
        assert err == 0, err
        if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return resp
        assert time.monotonic() < deadline, f"task still {resp.status}"
        time.sleep(0.05)


def _endpoints(store: Any, key: str) -> list[str]:
    eps = []
    for d in store.get_replica_desc(key):
        if d.is_memory_replica():
            eps.append(d.get_memory_descriptor().buffer_descriptor.transport_endpoint)
    return sorted(eps)


def _on(segment: str, n: int = 1) -> Any:
    cfg = replicate_config(n)
    cfg.preferred_segment = segment
    return cfg


@pytest.fixture
def cluster(master: Master, store_factory: StoreFactory) -> tuple[Any, list[Any]]:
    """A coordinator without a segment and three owners of 16 MiB segments."""
    owners = [store_factory(master, global_segment_size=16 * MiB) for _ in range(3)]
    coord = store_factory(master, global_segment_size=0)
    return coord, owners


def test_copy_gives_the_object_a_replica_on_every_target(cluster: Any) -> None:
    from mooncake.store import QueryTaskResponse, TaskStatus, TaskType

    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    payload = os.urandom(2 * MiB)
    assert coord.put("copy-me", payload, _on(segs[0])) == 0
    task_id, err = coord.create_copy_task("copy-me", segs[1:])
    assert err == 0
    assert isinstance(task_id, tuple) and len(task_id) == 2 and task_id != (0, 0)
    resp = _wait(coord, task_id)
    assert isinstance(resp, QueryTaskResponse)
    assert resp.status == TaskStatus.SUCCESS, resp.message
    assert resp.type == TaskType.REPLICA_COPY
    assert resp.id == task_id
    assert resp.assigned_client != (0, 0)
    assert resp.created_at_ms_epoch <= resp.last_updated_at_ms_epoch
    assert abs(resp.created_at_ms_epoch / 1000 - time.time()) < 60
    assert _endpoints(coord, "copy-me") == sorted(segs)
    assert coord.get("copy-me") == payload


def test_each_copy_holds_the_value(cluster: Any) -> None:
    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    payload = os.urandom(MiB + 17)
    assert coord.put("copy-bytes", payload, _on(segs[0])) == 0
    task_id, err = coord.create_copy_task("copy-bytes", [segs[2]])
    assert err == 0
    assert _wait(coord, task_id).message == ""
    # Move the original to segment 1: the copy on segment 2 and the moved
    # one remain, and each owner reads the value (owners 1 and 2 from their
    # own replica).
    task_id, err = coord.create_move_task("copy-bytes", segs[0], segs[1])
    assert err == 0
    _wait(coord, task_id)
    assert _endpoints(coord, "copy-bytes") == sorted(segs[1:])
    for o in owners:
        assert o.get("copy-bytes") == payload


def test_move_leaves_the_replica_on_the_target_only(cluster: Any) -> None:
    from mooncake.store import TaskStatus, TaskType

    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    payload = os.urandom(2 * MiB)
    assert coord.put("move-me", payload, _on(segs[0])) == 0
    task_id, err = coord.create_move_task("move-me", segs[0], segs[1])
    assert err == 0
    resp = _wait(coord, task_id)
    assert (resp.status, resp.type) == (TaskStatus.SUCCESS, TaskType.REPLICA_MOVE)
    assert _endpoints(coord, "move-me") == [segs[1]]
    assert coord.get("move-me") == payload


def test_copy_to_a_segment_that_holds_a_replica_adds_none(cluster: Any) -> None:
    from mooncake.store import TaskStatus

    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    cfg = replicate_config(2)
    cfg.preferred_segments = segs[:2]
    assert coord.put("two", b"x" * 2048, cfg) == 0
    task_id, err = coord.create_copy_task("two", [segs[1]])
    assert err == 0
    assert _wait(coord, task_id).status == TaskStatus.SUCCESS
    assert _endpoints(coord, "two") == sorted(segs[:2])


def test_bad_requests_get_upstream_codes_and_change_nothing(cluster: Any) -> None:
    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    assert coord.put("k", b"v" * 4096, _on(segs[0])) == 0
    # Unknown key: OBJECT_NOT_FOUND.
    assert coord.create_copy_task("missing", segs[1:]) == ((0, 0), -704)
    assert coord.create_move_task("missing", segs[0], segs[1]) == ((0, 0), -704)
    # Unknown or no target segments, a move onto itself or from a segment
    # holding no replica: INVALID_PARAMS.
    assert coord.create_copy_task("k", ["unknown_segment_1", "unknown_segment_2"]) == (
        (0, 0),
        -600,
    )
    assert coord.create_copy_task("k", []) == ((0, 0), -600)
    assert coord.create_move_task("k", "unknown_source_segment", segs[1]) == ((0, 0), -600)
    assert coord.create_move_task("k", segs[0], "unknown_destination_segment") == ((0, 0), -600)
    assert coord.create_move_task("k", segs[0], segs[0]) == ((0, 0), -600)
    assert coord.create_move_task("k", segs[1], segs[2]) == ((0, 0), -600)
    assert _endpoints(coord, "k") == [segs[0]]
    assert coord.get("k") == b"v" * 4096
    # A task id never created: TASK_NOT_FOUND; a task id of the wrong type
    # raises TypeError.
    assert coord.query_task((1, 2)) == (None, -1400)
    with pytest.raises(TypeError):
        coord.query_task("not-a-task")
    with pytest.raises(TypeError):
        coord.query_task((1, 2, 3))


def test_a_store_not_set_up_answers_minus_600() -> None:
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.create_copy_task("k", ["a"]) == ((0, 0), -600)
    assert s.create_move_task("k", "a", "b") == ((0, 0), -600)
    assert s.query_task((0, 1)) == (None, -600)
    # Upstream's keyword names.
    assert s.create_copy_task(key="k", targets=["a"]) == ((0, 0), -600)
    assert s.create_move_task(key="k", source="a", target="b") == ((0, 0), -600)
    assert s.query_task(task_id=(0, 1)) == (None, -600)
    assert s.batch_replica_clear(keys=["k"], segment_name="a") == []


def test_many_concurrent_copies_and_moves(cluster: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from mooncake.store import TaskStatus

    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    keys = [(f"cc{i}", segs[i % 3]) for i in range(60)]
    for k, s in keys:
        assert coord.put(k, k.encode() * 100, _on(s)) == 0
    with ThreadPoolExecutor(8) as ex:
        copies = list(
            ex.map(lambda ks: coord.create_copy_task(ks[0], [s for s in segs if s != ks[1]]), keys)
        )
    assert all(err == 0 for _, err in copies)
    for (k, _), (tid, _) in zip(keys, copies, strict=True):
        assert _wait(coord, tid).status == TaskStatus.SUCCESS
        assert _endpoints(coord, k) == sorted(segs)
        assert coord.get(k) == k.encode() * 100
    # Moving onto a segment that already holds a replica drops the source.
    with ThreadPoolExecutor(8) as ex:
        created = list(
            ex.map(
                lambda ks: coord.create_move_task(ks[0], ks[1], segs[segs.index(ks[1]) - 1]), keys
            )
        )
    assert all(err == 0 for _, err in created)
    for (k, src), (tid, _) in zip(keys, created, strict=True):
        assert _wait(coord, tid).status == TaskStatus.SUCCESS
        assert _endpoints(coord, k) == sorted(s for s in segs if s != src)
        assert coord.get(k) == k.encode() * 100


def test_many_concurrent_moves_of_single_replicas(cluster: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from mooncake.store import TaskStatus

    coord, owners = cluster
    segs = [o.get_hostname() for o in owners]
    moves = [(f"mv{i}", segs[i % 3], segs[(i + 1) % 3]) for i in range(60)]
    for k, src, _ in moves:
        assert coord.put(k, os.urandom(16) * 256, _on(src)) == 0
    values = {k: coord.get(k) for k, _, _ in moves}
    with ThreadPoolExecutor(8) as ex:
        created = list(ex.map(lambda m: coord.create_move_task(*m), moves))
    assert all(err == 0 for _, err in created)
    for (k, _, dst), (tid, _) in zip(moves, created, strict=True):
        assert _wait(coord, tid).status == TaskStatus.SUCCESS
        assert _endpoints(coord, k) == [dst]
        assert coord.get(k) == values[k]


def test_a_copy_that_finds_no_room_fails_after_its_retries(
    master_factory: Any, store_factory: StoreFactory
) -> None:
    from mooncake.store import TaskStatus

    m = master_factory(max_retry_attempts=1)
    big = store_factory(m, global_segment_size=16 * MiB)
    small = store_factory(m, global_segment_size=4 * MiB)
    payload = os.urandom(6 * MiB)
    assert big.put("big", payload, _on(big.get_hostname())) == 0
    task_id, err = big.create_copy_task("big", [small.get_hostname()])
    assert err == 0
    resp = _wait(big, task_id)
    assert resp.status == TaskStatus.FAILED
    assert "NO_AVAILABLE_HANDLE" in resp.message
    assert _endpoints(big, "big") == [big.get_hostname()]
    assert big.get("big") == payload


def test_the_pending_limit_refuses_new_tasks(
    master_factory: Any, store_factory: StoreFactory
) -> None:
    from mooncake.store import TaskStatus

    # The target has no room for these objects: the tasks stay PENDING
    # (retrying), so the queue fills.
    m = master_factory(max_total_pending_tasks=2, max_retry_attempts=100_000)
    a = store_factory(m, global_segment_size=16 * MiB)
    b = store_factory(m, global_segment_size=2 * MiB)
    for i in range(3):
        assert a.put(f"p{i}", b"z" * (3 * MiB), _on(a.get_hostname())) == 0
    first, second, third = (a.create_copy_task(f"p{i}", [b.get_hostname()]) for i in range(3))
    assert (first[1], second[1]) == (0, 0)
    assert third == ((0, 0), -1401)
    resp, err = a.query_task(first[0])
    assert (err, resp.status) == (0, TaskStatus.PENDING)
    assert _endpoints(a, "p2") == [a.get_hostname()]


def test_the_task_flags_are_accepted(master_factory: Any) -> None:
    m = master_factory(
        max_total_finished_tasks=5,
        max_total_pending_tasks=7,
        max_total_processing_tasks=3,
        pending_task_timeout_sec=0,
        processing_task_timeout_sec=0,
        max_retry_attempts=2,
    )
    assert m.proc is not None and m.proc.poll() is None


def test_task_enums_match_upstream() -> None:
    import mooncake.store as ms

    assert [int(ms.TaskStatus.PENDING), int(ms.TaskStatus.PROCESSING)] == [0, 1]
    assert [int(ms.TaskStatus.FAILED), int(ms.TaskStatus.SUCCESS)] == [2, 3]
    assert [int(ms.TaskType.REPLICA_COPY), int(ms.TaskType.REPLICA_MOVE)] == [0, 1]
    # Upstream exports the members at module level too.
    assert ms.PENDING == ms.TaskStatus.PENDING
    assert ms.REPLICA_MOVE == ms.TaskType.REPLICA_MOVE
    assert int(ms.ErrorCode.TASK_NOT_FOUND) == -1400
    assert int(ms.ErrorCode.TASK_PENDING_LIMIT_EXCEEDED) == -1401
