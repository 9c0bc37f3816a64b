#!/usr/bin/env python3
"""Resilience benchmarks: master restart, HA failover, cross-host path.

    python benchmarks/ha_bench.py restart     # ours and upstream side by side
    python benchmarks/ha_bench.py failover    # 3 HA masters on etcd (ours; needs etcd)
    python benchmarks/ha_bench.py crosshost   # network namespaces (ours; needs root)
    python benchmarks/ha_bench.py all

restart    4 client processes put 4 KiB objects (and read back earlier ones)
           in a loop; the master is SIGKILLed and started again on the same
           ports. Reported: objects lost (acknowledged puts that cannot be read
           once the clients have remounted; target 0), the time from the
           restarted master's start until every client's puts succeed again
           (target <= 1 s), and the longest call made during the gap.
           Upstream runs the same workload with its own master and wheel.
failover   3 masters with --enable_ha on one etcd, 4 clients given
           etcd://...; the leader is SIGKILLed. Reported: time from the kill
           until every client's puts succeed on the new leader (target <= 3 s
           with the default lease), objects lost (target 0).
crosshost  a writer and a reader in two network namespaces (hosts) on a
           bridge, the master in a third: get_into of 16 MiB and 4 KiB,
           against the same two processes on one host over loopback TCP, and
           with 10 ms of added latency on the reader's host.

The clients are tests/cluster/cluster_client.py processes. Figures measured
on a shared machine are preliminary: the table says the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
CLIENT = REPO / "tests" / "cluster" / "cluster_client.py"
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE.parent))
from _common import UPSTREAM_VENV, MiB, add_only, free_port, port_open
from helpers.json_child import JsonLineChild

# ------------------------------------------------------------------ processes


def ours_master() -> str | None:
    sib = Path(sys.executable).parent / "mooncake_master"
    return str(sib) if sib.exists() else shutil.which("mooncake_master")


def upstream_master() -> str | None:
    py = UPSTREAM_VENV / "bin" / "python"
    if not py.exists():
        return None
    out = subprocess.run(
        [
            str(py),
            "-c",
            "import mooncake,os;print(os.path.join(mooncake.__path__[0],'mooncake_master'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out if out and os.path.exists(out) else None


class Proc(JsonLineChild):
    """A JSON-lines client process (cluster_client.py); its stderr goes to a log file."""

    error = RuntimeError

    def __init__(
        self, python: str, argv_prefix: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        fd, path = tempfile.mkstemp(prefix="ha-bench-client-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)
        argv = [*(argv_prefix or []), python, str(CLIENT)]
        self._spawn(subprocess.Popen, argv, env, str(REPO), 60)

    def name(self) -> str:
        return f"client (log {self.log_path})"

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def call(self, op: str, timeout: float = 120, **kw: Any) -> Any:
        return super().call(op, timeout, **kw)

    def stop(self) -> None:
        self.ask_exit(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class MasterProc:
    def __init__(
        self, binary: str, argv: list[str], host: str, port: int, prefix: list[str] | None = None
    ) -> None:
        self.cmd = [*(prefix or []), binary, *argv]
        self.host, self.port = host, port
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the process
            prefix="ha-bench-master-", suffix=".log", delete=False
        )
        self.p: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, wait: bool = True) -> float:
        self.p = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        t0 = time.monotonic()
        while wait and not port_open(self.port, self.host):
            if self.p.poll() is not None or time.monotonic() - t0 > 30:
                raise RuntimeError(f"master did not start; log {self.log.name}")
            time.sleep(0.01)
        return time.time()

    def kill(self) -> float:
        assert self.p is not None
        self.p.send_signal(signal.SIGKILL)
        t = time.time()
        self.p.wait()
        return t


def load() -> str:
    with contextlib.suppress(OSError):
        return "load " + " ".join(open("/proc/loadavg").read().split()[:3])
    return "load ?"


# ------------------------------------------------------------------ restart


def gap_stats(summaries: list[dict[str, Any]], fail_at: float, back_at: float) -> dict[str, float]:
    """Per-client first successful put after the failure; longest call in the gap."""
    first_ok = []
    longest = 0.0
    for s in summaries:
        calls = s["calls_list"]
        ok = [t0 + d for (t0, d, op, rc) in calls if op == "put" and rc == 0 and t0 >= fail_at]
        first_ok.append(min(ok) if ok else float("inf"))
        for t0, d, _, _ in calls:
            if t0 + d >= fail_at and t0 <= max(first_ok[-1], fail_at):
                longest = max(longest, d)
    last = max(first_ok)
    return {
        "from_start_s": last - back_at,
        "from_failure_s": last - fail_at,
        "longest_call_s": longest,
    }


def run_workload(
    procs: list[Proc],
    master_addr: str,
    prefix: str,
    size: int,
    seconds: float,
    fault: Callable[[], tuple[float, float]],
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int], float, float]:
    """Set the clients up against ``master_addr``, run their put workload for
    ``seconds`` with ``fault()`` (returning when the master went away and when one
    was back) a third of the way in, and stop it: (per-client summaries, acked
    keys, acked keys the cluster lacks, killed, back)."""
    for p in procs:
        r = p.call(
            "setup",
            local_hostname="127.0.0.1",
            master_server_addr=master_addr,
            global_segment_size=256 * MiB,
        )
        assert r["rc"] == 0, r
    for i, p in enumerate(procs):
        p.call("workload_start", prefix=f"{prefix}{i}", size=size)
    time.sleep(seconds / 3)
    killed, back = fault()
    time.sleep(seconds * 2 / 3)
    sums = [p.call("workload_stop", with_calls=True) for p in procs]
    acked: dict[str, int] = {}
    for s in sums:
        acked.update(s["acked"])
    # Count what the cluster has once remounting is over (the gap is bounded).
    deadline = time.monotonic() + 10
    while True:
        missing = procs[0].call("check_many", size=size, keys=acked)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return sums, acked, missing, killed, back


def run_restart(
    side: str, python: str, master_bin: str, clients: int, seconds: float, size: int
) -> dict[str, Any]:
    rpc, metrics = free_port(), free_port()
    m = MasterProc(
        master_bin,
        [f"--rpc_port={rpc}", f"--metrics_port={metrics}", "--default_kv_lease_ttl=500"],
        "127.0.0.1",
        rpc,
    )
    procs = [Proc(python) for _ in range(clients)]
    try:

        def fault() -> tuple[float, float]:
            killed = m.kill()
            return killed, m.start()

        sums, acked, missing, killed, back = run_workload(
            procs, f"127.0.0.1:{rpc}", "w", size, seconds, fault
        )
        g = gap_stats(sums, killed, back)
        return {
            "side": side,
            "acked": len(acked),
            "lost": len(missing),
            "wrong": sum(s["wrong"] for s in sums)
            + sum(1 for v in missing.values() if v == -99999),
            **g,
        }
    finally:
        for p in procs:
            p.stop()
        with contextlib.suppress(Exception):
            m.kill()


# ------------------------------------------------------------------ failover


@contextlib.contextmanager
def local_etcd() -> Iterator[str]:
    etcd = shutil.which("etcd")
    if etcd is None:
        raise RuntimeError("etcd not installed (apt-get install etcd-server)")
    c, p = free_port(), free_port()
    d = tempfile.mkdtemp(
        prefix="ha-bench-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    proc = subprocess.Popen(
        [
            etcd,
            "--name=b",
            f"--data-dir={d}/data",
            f"--listen-client-urls=http://127.0.0.1:{c}",
            f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{p}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
            f"--initial-cluster=b=http://127.0.0.1:{p}",
            "--log-level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        t0 = time.monotonic()
        while not port_open(c):
            if time.monotonic() - t0 > 20:
                raise RuntimeError("etcd did not start")
            time.sleep(0.05)
        yield f"127.0.0.1:{c}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def health(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def run_failover(clients: int, seconds: float, size: int) -> dict[str, Any]:
    mb = ours_master()
    assert mb, "mooncake_master not found"
    with local_etcd() as ep:
        cluster = f"bench-{os.getpid()}"
        ms = []
        for _ in range(3):
            rpc, metrics = free_port(), free_port()
            argv = [
                "--enable_ha=true",
                "--ha_backend_type=etcd",
                f"--ha_backend_connstring={ep}",
                f"--cluster_id={cluster}",
                "--rpc_address=127.0.0.1",
                f"--rpc_port={rpc}",
                f"--metrics_port={metrics}",
                "--default_kv_lease_ttl=500",
            ]
            m = MasterProc(mb, argv, "127.0.0.1", rpc)
            m.metrics = metrics  # type: ignore[attr-defined]
            ms.append(m)
        t0 = time.monotonic()
        leader = None
        while leader is None and time.monotonic() - t0 < 20:
            ls = [m for m in ms if health(m.metrics).get("role") == "leader"]  # type: ignore[attr-defined]
            leader = ls[0] if len(ls) == 1 else None
            time.sleep(0.1)
        assert leader is not None, "no leader elected"
        procs = [Proc(sys.executable, env={"MC_STORE_CLUSTER_ID": cluster}) for _ in range(clients)]
        try:

            def fault() -> tuple[float, float]:
                killed = leader.kill()
                return killed, killed

            sums, acked, missing, killed, _ = run_workload(
                procs, f"etcd://{ep}", "f", size, seconds, fault
            )
            g = gap_stats(sums, killed, killed)
            return {
                "side": "ours",
                "acked": len(acked),
                "lost": len(missing),
                "wrong": sum(s["wrong"] for s in sums),
                **g,
            }
        finally:
            for p in procs:
                p.stop()
            for m in ms:
                with contextlib.suppress(Exception):
                    m.kill()


# ------------------------------------------------------------------ cross-host


def bench_pair(writer: Proc, reader: Proc, seg: str, n_small: int, n_big: int) -> dict[str, float]:
    out = {}
    for size, n in ((16 * MiB, n_big), (4096, n_small)):
        key = f"bench{size}"
        assert writer.call("put", key=key, size=size, seed=1, preferred=seg)["rc"] == 0
        reader.call("bench_get", key=key, size=size, n=2)  # warm up the connections
        r = reader.call("bench_get", key=key, size=size, n=n, timeout=600)
        assert r["rc"] == size, r
        med = statistics.median(r["times"])
        out[f"{size}"] = med
    return out


def run_crosshost(n_small: int, n_big: int) -> list[dict[str, Any]]:
    from netns import Faults, Net, unavailable_reason

    why = unavailable_reason()
    if why:
        raise RuntimeError(f"cross-host benchmark needs network namespaces: {why}")
    mb = ours_master()
    assert mb
    rows = []
    # Loopback: both clients in the root namespace, TCP forced between them.
    rpc, metrics = free_port(), free_port()
    m = MasterProc(mb, [f"--rpc_port={rpc}", f"--metrics_port={metrics}"], "127.0.0.1", rpc)
    env = {"MC_STORE_SAME_HOST": "off"}
    w, r = Proc(sys.executable, env=env), Proc(sys.executable, env=env)
    try:
        for p in (w, r):
            assert (
                p.call(
                    "setup",
                    local_hostname="127.0.0.1",
                    master_server_addr=f"127.0.0.1:{rpc}",
                    global_segment_size=128 * MiB,
                )["rc"]
                == 0
            )
        res = bench_pair(w, r, w.call("hostname"), n_small, n_big)
        rows.append({"path": "loopback TCP (one host)", **res})
    finally:
        w.stop()
        r.stop()
        m.kill()
    net = Net(["ctl", "c1", "c2"]).up()
    faults = Faults(net)
    try:
        m = MasterProc(
            mb,
            [f"--rpc_address={net.ip('ctl')}", "--rpc_port=50051", "--metrics_port=9003"],
            net.ip("ctl"),
            50051,
            prefix=["ip", "netns", "exec", net.ns("ctl")],
        )
        w = Proc(sys.executable, argv_prefix=["ip", "netns", "exec", net.ns("c1")])
        r = Proc(sys.executable, argv_prefix=["ip", "netns", "exec", net.ns("c2")])
        try:
            for p, h in ((w, "c1"), (r, "c2")):
                assert (
                    p.call(
                        "setup",
                        local_hostname=net.ip(h),
                        master_server_addr=f"{net.ip('ctl')}:50051",
                        global_segment_size=128 * MiB,
                    )["rc"]
                    == 0
                )
            seg = w.call("hostname")
            before = r.call("stats")
            res = bench_pair(w, r, seg, n_small, n_big)
            after = r.call("stats")
            assert after["bytes_read_same_host"] == before["bytes_read_same_host"]
            rows.append({"path": "cross-host TCP (netns, veth + bridge)", **res})
            how = faults.delay("c2", 10)
            res = bench_pair(w, r, seg, max(5, n_small // 50), max(2, n_big // 4))
            rows.append({"path": f"cross-host + 10 ms delay on the reader ({how})", **res})
        finally:
            w.stop()
            r.stop()
            m.kill()
    finally:
        faults.clear_all()
        net.down()
    return rows


# ------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["restart", "failover", "crosshost", "all"])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--size", type=int, default=4096)
    add_only(ap)
    ap.add_argument("--json")
    a = ap.parse_args()
    out: dict[str, Any] = {"load_before": load()}
    print(f"# {out['load_before']}")
    if a.what in ("restart", "all"):
        rows = []
        if a.only in (None, "ours"):
            mb = ours_master()
            assert mb, "mooncake_master not found"
            rows.append(run_restart("ours", sys.executable, mb, a.clients, a.seconds, a.size))
        if a.only in (None, "upstream"):
            um = upstream_master()
            if um is None:
                print(f"# upstream: not found at {UPSTREAM_VENV} (bash benchmarks/upstream_env.sh)")
            else:
                rows.append(
                    run_restart(
                        "upstream",
                        str(UPSTREAM_VENV / "bin" / "python"),
                        um,
                        a.clients,
                        a.seconds,
                        a.size,
                    )
                )
        print(
            f"\n## master SIGKILL + restart, {a.clients} clients, {a.size} B puts"
            " (targets: lost 0, puts again <= 1 s)"
        )
        print(
            "| side | puts acked | lost | wrong values | puts OK again after restart (s) | after kill (s) | longest call in the gap (s) |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['side']} | {r['acked']} | {r['lost']} | {r['wrong']} | {r['from_start_s']:.2f} | {r['from_failure_s']:.2f} | {r['longest_call_s']:.2f} |"
            )
        out["restart"] = rows
    if a.what in ("failover", "all"):
        r = run_failover(a.clients, a.seconds, a.size)
        print(
            f"\n## leader SIGKILL, 3 HA masters on etcd, {a.clients} clients"
            " (targets: <= 3 s, lost 0)"
        )
        print(
            "| side | puts acked | lost | wrong values | puts OK on the new leader after the kill (s) | longest call in the gap (s) |"
        )
        print("|---|---|---|---|---|---|")
        print(
            f"| {r['side']} | {r['acked']} | {r['lost']} | {r['wrong']} | {r['from_failure_s']:.2f} | {r['longest_call_s']:.2f} |"
        )
        out["failover"] = r
    if a.what in ("crosshost", "all"):
        rows = run_crosshost(2000, 24)
        print("\n## get_into, reader and owner on different hosts (median per call)")
        print("| path | 16 MiB (ms) | 16 MiB (GB/s) | 4 KiB (us) | 4 KiB (ops/s, one caller) |")
        print("|---|---|---|---|---|")
        for r in rows:
            big, small = r[str(16 * MiB)], r["4096"]
            print(
                f"| {r['path']} | {big * 1e3:.2f} | {16 * MiB / big / 1e9:.2f} | {small * 1e6:.0f} | {1 / small:.0f} |"
            )
        out["crosshost"] = rows
    out["load_after"] = load()
    print(f"# {out['load_after']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
