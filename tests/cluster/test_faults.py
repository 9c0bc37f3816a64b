"""Network faults between hosts: added latency, packet loss and a
5 s partition of one client host. Calls return (success or an error) within
their timeout and never hang; no read ever returns a wrong value; after the
fault is gone everything works again and nothing acknowledged is lost.

The output says which mechanism made the fault (netem, or iptables and the
NFQUEUE delayer where the kernel has no sch_netem).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

MiB = 1 << 20
SEGMENT = 256 * MiB
VALUE = 16384
# A call may take as long as the transfer IO timeout when a peer vanishes
# mid-transfer; anything longer is a hang.
CALL_LIMIT_S = 35.0


def _pair(masters: Any, clients: Any) -> tuple[Any, Any, Any]:
    m = masters("ctl")
    a, b = clients("c1"), clients("c2")
    # Large enough segments that the workloads never trigger eviction.
    assert a.setup(m.rpc_addr, global_segment_size=SEGMENT)["rc"] == 0
    assert b.setup(m.rpc_addr, global_segment_size=SEGMENT)["rc"] == 0
    return m, a, b


def _check_workloads(a: Any, b: Any, wa: dict[str, Any], wb: dict[str, Any], size: int) -> None:
    for w in (wa, wb):
        assert w["wrong"] == 0, w["by_rc"]
        assert not w["alive"], "a workload call never returned"
        assert w["max_call_s"] < CALL_LIMIT_S, w["max_call_s"]
    # Each side reads everything the other side wrote and was told succeeded.
    assert a.call("check_many", size=size, keys=wb["acked"], timeout=120) == {}
    assert b.call("check_many", size=size, keys=wa["acked"], timeout=120) == {}


@pytest.mark.slow
def test_10ms_latency(net: Any, masters: Any, clients: Any, faults: Any) -> None:
    _m, a, b = _pair(masters, clients)
    seg_a = a.call("hostname")
    assert a.call("put", key="big", size=16 * MiB, seed=3, preferred=seg_a)["rc"] == 0
    how = faults.delay("c2", 10)
    print(f"latency injected with: {how}")
    r = b.call("get", key="big", size=16 * MiB, seed=3)
    assert r["rc"] == 16 * MiB
    # Every master round trip now takes >= 10 ms: a put needs several.
    p = b.call("put", key="slow", size=4096, seed=4)
    assert p["rc"] == 0 and p["s"] >= 0.010, p
    a.call("workload_start", prefix="la", size=VALUE)
    b.call("workload_start", prefix="lb", size=VALUE)
    time.sleep(3.0)
    wa, wb = a.call("workload_stop"), b.call("workload_stop")
    faults.clear("c2")
    assert wa["by_rc"].get("put:0", 0) > 0 and wb["by_rc"].get("put:0", 0) > 0
    _check_workloads(a, b, wa, wb, VALUE)


@pytest.mark.slow
def test_5_percent_loss(net: Any, masters: Any, clients: Any, faults: Any) -> None:
    _m, a, b = _pair(masters, clients)
    how = faults.loss("c2", 5)
    print(f"loss injected with: {how}")
    a.call("workload_start", prefix="xa", size=VALUE)
    b.call("workload_start", prefix="xb", size=VALUE)
    time.sleep(4.0)
    wa, wb = a.call("workload_stop"), b.call("workload_stop")
    faults.clear("c2")
    assert wb["by_rc"].get("put:0", 0) > 0, wb["by_rc"]
    _check_workloads(a, b, wa, wb, VALUE)


@pytest.mark.slow
def test_client_host_partitioned_for_5s(net: Any, masters: Any, clients: Any, faults: Any) -> None:
    m, a, b = _pair(masters, clients)
    seg_b = b.call("hostname")
    # Objects held by the host that will be cut off.
    held = {}
    for i in range(16):
        assert a.call("put", key=f"held{i}", size=65536, seed=i, preferred=seg_b)["rc"] == 0
        held[f"held{i}"] = i
    a.call("workload_start", prefix="pa", size=VALUE)
    b.call("workload_start", prefix="pb", size=VALUE)
    time.sleep(1.0)
    faults.partition("c2")
    # While c2 is away, c1 keeps working against the master.
    t0 = time.monotonic()
    r = a.call("put", key="during", size=4096, seed=9, preferred=a.call("hostname"))
    assert r["rc"] == 0, r
    assert time.monotonic() - t0 < CALL_LIMIT_S
    time.sleep(max(0.0, 5.0 - (time.monotonic() - t0)))
    faults.heal("c2")
    time.sleep(2.0)
    wa, wb = a.call("workload_stop", timeout=120), b.call("workload_stop", timeout=120)
    # c2 felt the partition (its calls failed, or stalled until it healed and
    # then completed), and works after it.
    failed = any(k.startswith(("put:-", "get:-")) for k in wb["by_rc"])
    assert failed or wb["max_call_s"] >= 2.0, wb
    print(f"c2 during the partition: {wb['by_rc']}, longest call {wb['max_call_s']:.2f}s")
    assert b.call("put", key="after", size=4096, seed=5)["rc"] == 0
    _check_workloads(a, b, wa, wb, VALUE)
    assert a.call("check_many", size=65536, keys=held, timeout=120) == {}
    assert seg_b in [s for s in m.admin("/get_all_segments")[1].decode().splitlines()]
