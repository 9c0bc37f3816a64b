"""How the ranks of a Mooncake process group meet through torch's store.

Every key lives under ``mcpg/v1/{generation}``:

* the generation: every construction of a group adds one to
  ``mcpg/v1/epoch``, so the n-th group of size n shares generation
  ``(epoch - 1) // size``; rank 0 publishes it as ``mcpg/v1/gen`` for the
  processes that join later (``is_extension``);
* ``coordinator``: the address of the membership coordinator, which rank 0
  of the default group starts (every other group of the job reuses it; a
  Mooncake group whose default group is not one hosts its own);
* ``peer/{rank}``: the record of a member (its data endpoint, member and
  instance ids, host identity and shared-memory name), which every founding
  member waits for before it connects to its peers;
* ``failed/{rank}``: why a rank will not come, written best effort when its
  construction fails, so that the peers waiting for it can say why.

It also holds the process-wide state the groups share: the coordinator's
address and the address ``set_host_ip`` chose, the spin policy (which
depends on how many ranks share this rank's CPUs), and the closing handshake with
the TCPStore of the default group when it is destroyed.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from mooncake import _native
from mooncake.pg._host import cpu_mask, host_identity, machine_identity

PREFIX = "mcpg/v1"
# Version of the peer record.
PROTO = 1
# The membership coordinator's address once the default group is a Mooncake
# group (subgroups use it), and the address set by ``set_host_ip``.
PROCESS_COORDINATOR: list[str | None] = [None]
HOST_OVERRIDE: list[str | None] = [None]
AUTO_SPIN_US = 30
# Longest a rank's destroy of the default group waits for rank 0's.
CLOSE_WAIT_S = 10.0
# Most ranks sharing this rank's CPUs seen in any group of this process
# (spin policy).
_MAX_LOCAL_RANKS = [1]
_WARNED_THREADS = [False]


def timeout_s(t: datetime.timedelta | float | None, default: float = 1800.0) -> float:
    """A timeout in seconds (at least 1 ms); ``default`` for None."""
    if t is None:
        return default
    if isinstance(t, datetime.timedelta):
        return max(t.total_seconds(), 0.001)
    return max(float(t), 0.001)


def store_failure(e: BaseException, timeout: float) -> str:
    """What went wrong with a store wait: its deadline, or the store itself
    (its host closed it or went away)."""
    lost = getattr(dist, "DistNetworkError", None)
    if lost is not None and isinstance(e, lost):
        return f"lost the connection to the store ({e})"
    return f"timed out after {timeout:.1f}s"


def generation(store: Store, rank: int, size: int, is_extension: bool) -> int:
    """This group's generation (see the module doc); its keys live under
    ``prefix(generation)``."""
    if is_extension:
        # Joiners take the generation the founding members are using.
        gen_key = f"{PREFIX}/gen"
        gen = int(store.get(gen_key)) if store.check([gen_key]) else 0
    else:
        gen = (int(store.add(f"{PREFIX}/epoch", 1)) - 1) // size
        if rank == 0:
            store.set(f"{PREFIX}/gen", str(gen))
    return gen


def prefix(gen: int) -> str:
    """The key prefix of generation ``gen``."""
    return f"{PREFIX}/{gen}"


def coordinator_endpoint(
    store: Store,
    key_prefix: str,
    rank: int,
    is_extension: bool,
    default_group: bool,
    host: str,
    timeout: float,
    name: str,
) -> tuple[str, _native.PgCoordinator | None]:
    """Where the membership coordinator of this group runs, and the
    coordinator this rank started for it (rank 0 of the default group, or of
    a Mooncake group whose default group is not one), if any."""
    if not default_group and PROCESS_COORDINATOR[0] is not None:
        return PROCESS_COORDINATOR[0], None
    key = f"{key_prefix}/coordinator"
    if rank == 0 and not is_extension:
        coordinator = _native.PgCoordinator(host)
        try:
            store.set(key, coordinator.endpoint())
        except BaseException:
            coordinator.shutdown()
            raise
        return str(coordinator.endpoint()), coordinator
    try:
        store.wait([key], datetime.timedelta(seconds=timeout))
    except Exception as e:  # torch raises DistStoreError / RuntimeError
        raise RuntimeError(
            f"{name}: {store_failure(e, timeout)} waiting for rank 0 to "
            "start the membership coordinator"
        ) from e
    return bytes(store.get(key)).decode(), None


def report_failure(store: Store, key_prefix: str, rank: int, e: BaseException) -> None:
    """Tells the peers waiting for this rank why it will not come (for
    example a cluster token the coordinator refused), best effort."""
    with contextlib.suppress(Exception):  # the store may be gone too
        store.set(f"{key_prefix}/failed/{rank}", f"{type(e).__name__}: {e}")


def meet_peers(
    native: _native.PgGroup,
    store: Store,
    key_prefix: str,
    rank: int,
    size: int,
    is_extension: bool,
    group_id: str,
    host: str,
    timeout: float,
    name: str,
) -> None:
    """Publishes this rank's peer record; a founding member then waits for
    every other record and connects to those peers."""
    me_host = host_identity()
    record = {
        "proto": PROTO,
        "member_id": native.member_id(),
        "instance_id": native.instance_id(),
        "endpoint": f"{host}:{native.port()}",
        "host": me_host,
        "pid": os.getpid(),
        "capacity": native.capacity(),
        "is_extension": is_extension,
        "shm": native.shm_name(),
        "machine": machine_identity(),
        "cpus": hex(cpu_mask()),
    }
    store.set(f"{key_prefix}/peer/{rank}", json.dumps(record))
    if is_extension or size == 1:
        return
    keys = {r: f"{key_prefix}/peer/{r}" for r in range(size) if r != rank}
    try:
        store.wait(list(keys.values()), datetime.timedelta(seconds=timeout))
    except Exception as e:  # torch raises DistStoreError / RuntimeError
        missing: list[int] | str = "?"
        why = ""
        with contextlib.suppress(Exception):  # the store itself may be gone
            missing = [r for r, k in keys.items() if not store.check([k])]
            why = "".join(
                f"; rank {r} failed: {bytes(store.get(f)).decode(errors='replace')}"
                for r in missing
                if store.check([f := f"{key_prefix}/failed/{r}"])
            )
        raise RuntimeError(
            f"{name}: {store_failure(e, timeout)} waiting for rank(s) "
            f"{missing} to join process group '{group_id}'{why}"
        ) from e
    peers = []
    sharing = 1
    me_cpus = (machine_identity(), cpu_mask())
    for r, k in keys.items():
        rec = json.loads(store.get(k))
        peers.append(
            (r, rec["endpoint"], int(rec["member_id"]), rec["host"] == me_host, rec["shm"])
        )
        sharing += shares_cpus(rec, me_host, me_cpus)
    set_spin(native, sharing)
    fit_threads(sharing)
    try:
        native.connect(peers, timeout)
    except TimeoutError as e:
        raise RuntimeError(f"{name}: {e} (process group '{group_id}')") from e


def shares_cpus(rec: dict[str, Any], me_host: str, me_cpus: tuple[str, int]) -> bool:
    """Whether the rank of peer record ``rec`` runs on CPUs this rank may run
    on, given this rank's host and ``(machine_identity(), cpu_mask())``: the
    same machine (kernel) and overlapping affinity. Ranks in other network
    namespaces or containers of this machine compete for its cores as much
    as ranks beside this one do. A record without these fields counts when
    its host is ours."""
    machine, cpus = rec.get("machine"), rec.get("cpus")
    if not isinstance(machine, str) or not isinstance(cpus, str):
        return bool(rec.get("host") == me_host)
    try:
        mask = int(cpus, 16)
    except ValueError:
        return machine == me_cpus[0]
    return machine == me_cpus[0] and mask & me_cpus[1] != 0


def host_cpus() -> int:
    """The CPUs this process may run on (at least 1)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def set_spin(native: _native.PgGroup, local_ranks: int) -> None:
    """Short spin before sleeping only while every rank on this rank's CPUs
    (``local_ranks``, this one included) can own a core.

    ``MOONCAKE_PG_SPIN_US`` overrides the choice.
    """
    if "MOONCAKE_PG_SPIN_US" in os.environ:
        return
    _MAX_LOCAL_RANKS[0] = max(_MAX_LOCAL_RANKS[0], local_ranks)
    native.set_spin_us(AUTO_SPIN_US if host_cpus() >= _MAX_LOCAL_RANKS[0] else 0)


# Environment variables through which a user chooses the ranks' compute
# threads; while none is set, the thread count is the backend's to fit.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def fit_threads(local_ranks: int) -> None:
    """Fits this rank's torch threads to its share of the host's CPUs when
    the ``local_ranks`` ranks on those CPUs would otherwise run more compute
    threads than it has, and says so once per process.

    OpenMP's idle threads spin for milliseconds between parallel regions
    (libgomp's default wait policy). While a rank waits for a collective,
    its idle OpenMP threads spin on the cores its peers need to finish that
    collective, so every wait grows and with it the spinning: FSDP2 on 2
    CPUs at world 2 ran 4-16x slower with torch's default of one thread per
    CPU in each rank than with one thread per rank. So, as torchrun does
    for every rank it starts, a rank whose launcher left the thread count to
    torch (``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` unset) runs
    ``torch.set_num_threads(cpus // ranks_on_this_host)`` (at least 1).
    With either variable set the rank keeps its threads and gets a warning."""
    threads = torch.get_num_threads()
    cpus = host_cpus()
    if threads <= 1 or local_ranks * threads <= cpus:
        return
    share = max(1, cpus // local_ranks)
    chosen = [v for v in THREAD_ENV if os.environ.get(v)]
    if not chosen:
        torch.set_num_threads(share)
    if _WARNED_THREADS[0]:
        return
    _WARNED_THREADS[0] = True
    head = (
        f"mooncake-pg: {local_ranks} ranks on the same CPUs would each run {threads} torch "
        f"threads on {cpus} CPUs, and spinning OpenMP threads would take the CPUs from "
        "compute and communication"
    )
    if chosen:
        msg = (
            f"{head}. {chosen[0]} is set, so the threads stay; set it to {share} "
            f"(or call torch.set_num_threads({share})) in each rank."
        )
    else:
        msg = (
            f"{head}; this rank now runs torch.set_num_threads({share}), as torchrun "
            "does. Set OMP_NUM_THREADS to choose the count yourself."
        )
    warnings.warn(msg, RuntimeWarning, stacklevel=2)


def watch_store(store: Store) -> socket.socket | None:
    """A bare connection to the TCPStore server behind ``store``, which
    only ever reads the server closing it (see ``await_store_close``)."""
    base = store
    while isinstance(base, PrefixStore):
        base = base.underlying_store
    if not isinstance(base, TCPStore):
        return None
    try:
        return socket.create_connection((base.host, base.port), timeout=5.0)
    except OSError:
        return None


def await_store_close(watch: socket.socket, host_live: bool) -> None:
    """Destroying the default group ends once torch's rendezvous store is gone.

    With ``env://`` or ``tcp://`` initialisation torch creates the store,
    rank 0 hosts it, and torch frees it a moment after this group's shutdown
    on rank 0. A rank that left earlier and re-initialised at once on the
    same ``MASTER_PORT`` would reach that old store just before it closes,
    and its second ``init_process_group`` would fail (``recvValue failed``;
    gloo has the same race). So every other rank waits until rank 0's
    store server closed its connection (``watch``, opened at init; a failing
    store request would make torch log the error), at most ``CLOSE_WAIT_S``
    (a rank 0 that goes on serving without destroying). A store the user
    passed in outlives the group and is not waited on; neither is a rank 0
    this member no longer counts as live.
    """
    if not host_live or getattr(dist.distributed_c10d, "_default_pg_init_method", None) is None:
        return
    with contextlib.suppress(OSError):  # reset, or the wait's bound
        watch.settimeout(CLOSE_WAIT_S)
        while watch.recv(4096):  # the server never writes here; b"" is its close
            pass
