"""``MooncakeProcessGroup``: the torch ProcessGroup subclass over the Rust core.

Torch's C++ trampoline dispatches to these methods by name, so
both current and legacy method names are defined. Validation happens here,
synchronously, before anything is submitted. How the ranks meet through
torch's store is ``_rendezvous``; how tensors reach host memory the core can
address is ``_staging``; each op's handle is a ``MooncakeWork``, which tells
the group through its ``on_done`` callback when it is finalized.
"""

from __future__ import annotations

import contextlib
import datetime
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from mooncake import _native
from mooncake.pg import _codes, _rendezvous
from mooncake.pg._host import advertised_host, host_identity, store_host
from mooncake.pg._options import MAX_CAPACITY, MooncakeBackendOptions
from mooncake.pg._staging import Finish, host_in, host_inout, host_out, nbytes
from mooncake.pg._work import MooncakeWork

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

_STRIDED = torch.strided
# Completed ops are reaped from the in-flight table once it holds this many.
_REAP_AT = 64


class _Shim(_C10dBackend):
    """Backend registered on the group so torch paths that need one (batch P2P,
    ``device_id`` init) find it; every call is delegated to the owning group."""

    def __init__(self, pg: MooncakeProcessGroup, rank: int, capacity: int) -> None:
        super().__init__(rank, capacity)
        self._pg = weakref.ref(pg)
        self._options = _C10dBackend.Options(
            pg.getBackendName(), datetime.timedelta(seconds=pg._timeout)
        )

    @property
    def options(self) -> _C10dBackend.Options:
        """The backend's name and timeout. Defined here because torch's
        trampoline for a Python backend looks ``options`` up on the Python
        object, and the base class's own property calls that trampoline
        again (endless recursion; torch 2.15 asks for it when it attaches
        its flight recorder to a group)."""
        return self._options

    def _owner(self) -> MooncakeProcessGroup:
        pg = self._pg()
        if pg is None:
            raise RuntimeError("mooncake: process group has been destroyed")
        return pg

    def getBackendName(self) -> str:
        return self._owner().getBackendName()

    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_splitting(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the C++ base does not define.
        return getattr(self._owner(), name)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> MooncakeWork:
        return self._owner().send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> MooncakeWork:
        return self._owner().recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> MooncakeWork:
        return self._owner().recv_anysource(tensors, tag)

    def barrier(self, opts: Any = None) -> MooncakeWork:
        return self._owner().barrier(opts=opts)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MooncakeWork:
        return self._owner().allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> MooncakeWork:
        return self._owner().broadcast(tensors, opts)

    def allgather(self, outs: Any, ins: Any, opts: Any = None) -> MooncakeWork:
        return self._owner().allgather(outs, ins, opts)

    def reduce_scatter(self, outs: Any, ins: Any, opts: Any = None) -> MooncakeWork:
        return self._owner().reduce_scatter(outs, ins, opts)

    def alltoall(self, outs: Any, ins: Any, opts: Any = None) -> MooncakeWork:
        return self._owner().alltoall(outs, ins, opts)


class MooncakeProcessGroup(dist.ProcessGroup):
    """A Mooncake process group (``mooncake-cpu`` or ``mooncake``)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: Any,
        group_id: str,
        backend_name: str,
        device_type: str,
        options: MooncakeBackendOptions | None,
    ) -> None:
        super().__init__(rank, size)
        if options is not None and not isinstance(options, MooncakeBackendOptions):
            raise TypeError(
                f"pg_options must be MooncakeBackendOptions, got {type(options).__name__}"
            )
        opts = options or MooncakeBackendOptions()
        default_group = not dist.is_initialized()
        capacity = opts.max_group_size or size
        if capacity < size:
            raise ValueError(
                f"{backend_name}: max_group_size ({capacity}) must be >= the group size ({size})"
            )
        if capacity > MAX_CAPACITY:
            raise ValueError(f"mooncake: at most {MAX_CAPACITY} ranks are supported")
        self._name = backend_name
        self._device_type = device_type
        self._cpu = device_type == "cpu"
        self._rank = rank
        self._is_extension = opts.is_extension
        self._timeout = _rendezvous.timeout_s(timeout)
        self._inflight: dict[int, MooncakeWork] = {}
        self._closed = False
        self._mask_dev, self._mask_host = self._make_mask(opts.active_ranks, capacity)
        self._last_mask = -1
        self._coordinator: _native.PgCoordinator | None = None
        self._default_group = default_group

        gen = _rendezvous.generation(store, rank, size, opts.is_extension)
        self._key_prefix = _rendezvous.prefix(gen)
        key = f"{group_id}/{backend_name}/{gen}"
        host = advertised_host(opts.host_ip or _rendezvous.HOST_OVERRIDE[0], store_host(store))
        self._native = _native.PgGroup(
            rank,
            size,
            capacity,
            opts.is_extension,
            key,
            opts.auto_deactivate_on_failure,
            opts.auto_sync_on_failure,
            host_identity(),
        )
        self._native.set_mask_tensor(self._mask_host.data_ptr(), capacity, self._mask_host)
        self._sync_mask()
        try:
            coordinator, self._coordinator = _rendezvous.coordinator_endpoint(
                store,
                self._key_prefix,
                rank,
                opts.is_extension,
                default_group,
                host,
                self._timeout,
                self._name,
            )
            self._native.attach(coordinator, f"{host}:{self._native.port()}", self._timeout)
            _rendezvous.meet_peers(
                self._native,
                store,
                self._key_prefix,
                rank,
                size,
                opts.is_extension,
                group_id,
                host,
                self._timeout,
                self._name,
            )
        except BaseException as e:
            _rendezvous.report_failure(store, self._key_prefix, rank, e)
            self._native.shutdown()
            if self._coordinator is not None:
                self._coordinator.shutdown()
            raise
        # The default group's rank 0 hosts torch's rendezvous store; the
        # other ranks watch it for the closing handshake (see shutdown).
        self._store_watch = _rendezvous.watch_store(store) if default_group and rank != 0 else None
        if default_group:
            _rendezvous.PROCESS_COORDINATOR[0] = coordinator
        try:
            shim = _Shim(self, rank, capacity)
            self._shim = shim
            dev = torch.device(device_type)
            self._register_backend(dev, dist.ProcessGroup.BackendType.CUSTOM, shim)
            self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        except (AttributeError, RuntimeError, TypeError):  # older torch: optional
            pass
        self._group_id = group_id
        # torch <= 2.12 returns custom groups before naming them
        with contextlib.suppress(AttributeError, RuntimeError, TypeError):
            self._set_group_name(cast("GroupName", group_id))

    # ----------------------------------------------------------------- setup
    def _make_mask(
        self, active: torch.Tensor | None, capacity: int
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        if active is None:
            return None, torch.zeros(capacity, dtype=torch.int32)
        if active.numel() != capacity:
            raise ValueError(
                f"active_ranks has {active.numel()} entries but the capacity is {capacity}"
            )
        # Upstream: the mirror "may be on CPU or GPU", whichever the backend.
        # A CPU tensor is written in place by the core; any other device gets
        # a host mask that is copied into it whenever the view changes.
        if active.device.type == "cpu":
            return None, active
        return active, torch.zeros(capacity, dtype=torch.int32)

    def _sync_mask(self) -> None:
        if self._mask_dev is None:
            return
        m = self._native.mask()
        if m != self._last_mask:
            self._last_mask = m
            if self._mask_dev.numel() != self._mask_host.numel():
                self._mask_dev.resize_(self._mask_host.numel())
            self._mask_dev.copy_(self._mask_host)

    # -------------------------------------------------------------- identity
    @property
    def group_name(self) -> GroupName:
        """Torch's group name; falls back to the group id where torch (<= 2.12)
        cannot attach a Python backend to carry it."""
        try:
            return cast("GroupName", str(super().group_name))
        except RuntimeError:
            return cast("GroupName", self._group_id)

    def getBackendName(self) -> str:
        return self._name

    def name(self) -> str:
        return self._name

    def getSize(self) -> int:
        return int(self._native.visible_size())

    def size(self) -> int:
        return self.getSize()

    def getRank(self) -> int:
        return self._rank

    def rank(self) -> int:
        return self._rank

    # ------------------------------------------------------------- plumbing
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self._name}: process group has been shut down")

    def _check_tensor(self, t: Any, what: str) -> torch.Tensor:
        if self._cpu and type(t) is torch.Tensor and t.is_cpu and t.layout is _STRIDED:
            return t  # fast path
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{self._name}: {what} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{self._name}: {what} is sparse ({t.layout}); only dense tensors")
        if t.device.type != self._device_type:
            raise ValueError(
                f"{self._name}: {what} is on {t.device}, expected a {self._device_type} tensor"
            )
        return t

    def _single(self, tensors: Any, op: str) -> torch.Tensor:
        if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
            n = len(tensors) if isinstance(tensors, (list, tuple)) else "a non-list"
            raise ValueError(f"{self._name}: {op} takes exactly one tensor, got {n}")
        return self._check_tensor(tensors[0], f"{op} tensor")

    def _work(
        self,
        native: _native.PgWork,
        keep: list[Any],
        finish: list[Finish],
        result: list[torch.Tensor],
    ) -> MooncakeWork:
        if self._mask_dev is not None:
            finish.append(self._sync_mask)
        if len(self._inflight) >= _REAP_AT:
            for done in list(self._inflight.values()):
                done.is_completed()  # a completed op is finalized: it leaves the table
        w = MooncakeWork(
            native, keep, finish, result, capacity=self._native.capacity, on_done=self._forget
        )
        self._inflight[id(w)] = w
        return w

    def _forget(self, w: MooncakeWork) -> None:
        """``on_done`` of this group's Works: a finalized op leaves the
        in-flight table (which keeps the Work, and so its tensors, alive
        until then)."""
        self._inflight.pop(id(w), None)

    def _check_k(self, k: int, what: str) -> None:
        cap = self.capacity
        if not 1 <= k <= cap:
            raise ValueError(
                f"{self._name}: {what} has {k} entries; expected between 1 and "
                f"the group capacity {cap} (group size {self.getSize()})"
            )

    def _same(self, ref: torch.Tensor, ts: Sequence[Any], what: str) -> list[torch.Tensor]:
        out = []
        for i, t in enumerate(ts):
            t = self._check_tensor(t, f"{what}[{i}]")
            if t.numel() != ref.numel() or t.dtype != ref.dtype:
                raise ValueError(
                    f"{self._name}: {what}[{i}] has {t.numel()} x {t.dtype}, expected "
                    f"{ref.numel()} x {ref.dtype}"
                )
            out.append(t)
        return out

    @staticmethod
    def _root(opts: Any) -> int:
        return int(getattr(opts, "rootRank", 0)) + int(getattr(opts, "rootTensor", 0) or 0)

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.capacity:
            raise ValueError(f"{self._name}: root {root} is outside the group")

    # ------------------------------------------------------------ collectives
    @staticmethod
    def _codes(dtype: torch.dtype, opts: Any, reduces: bool) -> tuple[int, int]:
        """(dtype code, reduce-op code); validates the pair for reductions."""
        if not reduces:
            return _codes.dtype_code(dtype), 0
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return _codes.reduction_codes(dtype, op)

    def _submit(
        self,
        kind: str,
        srcs: list[int],
        dsts: list[int],
        nbytes: int,
        codes: tuple[int, int],
        keep: list[Any],
        finish: list[Finish],
        result: list[torch.Tensor],
        root: int = 0,
    ) -> MooncakeWork:
        n = self._native.submit(kind, srcs, dsts, nbytes, codes[0], codes[1], root)
        return self._work(n, keep, finish, result)

    def _one_list(self, lists: object, what: str) -> object:
        """The one element of a one-element list or tuple (the caller's tensor
        list, or one tensor, which the op validates)."""
        if not isinstance(lists, (list, tuple)) or len(lists) != 1:
            raise ValueError(f"{self._name}: {what} takes exactly one tensor list")
        return cast(object, lists[0])

    def _root_only(self, lists: Any, what: str) -> None:
        """Non-root ranks pass no slots (None), only empty lists."""
        if lists and any(len(x) for x in lists):
            raise ValueError(f"{self._name}: {what} list must be empty on non-root ranks")

    def _root_list(self, opts: Any, lists: Any, op: str, side: str) -> tuple[int, object]:
        """The checked root of ``opts`` and, on the root, its one tensor list
        of ``lists`` (the ``side`` of ``op``); non-root ranks pass no slots
        (None) and must give only empty lists."""
        root = self._root(opts)
        self._check_root(root)
        if root == self._rank:
            return root, self._one_list(lists, f"{op} root {side}")
        self._root_only(lists, f"{op} {side}")
        return root, None

    def _slots(
        self, spec: Any, unit: torch.Tensor, what: str, finish: list[Finish], out: bool
    ) -> tuple[list[int], list[Any]]:
        """Per-slot addresses (slot j always means rank j) and what to keep alive. ``spec`` is a
        tensor list (K = its length, each like ``unit``) or one tensor (K =
        numel / unit.numel()); outputs go through temporaries where needed."""
        if not isinstance(spec, torch.Tensor):
            ts = self._same(unit, spec, what)
            self._check_k(len(ts), what)
            hosts = [host_out(t, finish) if out else host_in(t) for t in ts]
            return [h.data_ptr() for h in hosts], [ts, hosts]
        big = self._check_tensor(spec, what)
        if big.dtype != unit.dtype:
            raise ValueError(f"{self._name}: output dtype {big.dtype} != input dtype {unit.dtype}")
        if unit.numel() == 0 or big.numel() % unit.numel() != 0:
            raise ValueError(
                f"{self._name}: {what} has {big.numel()} elements, "
                f"not a multiple of {unit.numel()} (the per-rank size)"
            )
        k = big.numel() // unit.numel()
        self._check_k(k, what)
        host = host_out(big, finish) if out else host_in(big)
        nb, base = nbytes(unit), host.data_ptr()
        return [base + j * nb for j in range(k)], [big, host]

    def _inplace(
        self, kind: str, tensors: Any, opts: Any, reduces: bool, rooted: bool
    ) -> MooncakeWork:
        """all_reduce, broadcast and reduce: one tensor, updated in place."""
        self._check_open()
        t = self._single(tensors, kind)
        root = self._root(opts) if rooted else 0
        if rooted:
            self._check_root(root)
        codes = self._codes(t.dtype, opts, reduces)
        finish: list[Finish] = []
        # A reduce's non-root ranks only send: their tensor is not written.
        buf = host_in(t) if kind == "reduce" and root != self._rank else host_inout(t, finish)
        p = buf.data_ptr()
        return self._submit(kind, [p], [p], nbytes(buf), codes, [t, buf], finish, [t], root)

    def _collect(self, kind: str, inp: Any, spec: Any, what: str, root: int = 0) -> MooncakeWork:
        """all_gather and gather: everyone's input into per-slot outputs
        (``spec`` is None on a gather's non-root ranks)."""
        inp = self._check_tensor(inp, f"{kind} input")
        finish: list[Finish] = []
        src = host_in(inp)
        ptrs, keep = ([], []) if spec is None else self._slots(spec, inp, what, finish, True)
        result = [] if spec is None else [spec] if isinstance(spec, torch.Tensor) else list(spec)
        codes = self._codes(inp.dtype, None, False)
        return self._submit(
            kind,
            [src.data_ptr()],
            ptrs,
            nbytes(src),
            codes,
            [inp, src, keep],
            finish,
            result,
            root,
        )

    def _spread(
        self, kind: str, out: Any, spec: Any, what: str, opts: Any, root: int = 0
    ) -> MooncakeWork:
        """reduce_scatter and scatter: per-slot inputs into one output per rank
        (``spec`` is None on a scatter's non-root ranks)."""
        out = self._check_tensor(out, f"{kind} output")
        codes = self._codes(out.dtype, opts, kind == "reduce_scatter")
        finish: list[Finish] = []
        host = host_out(out, finish)
        ptrs, keep = ([], []) if spec is None else self._slots(spec, out, what, finish, False)
        return self._submit(
            kind,
            ptrs,
            [host.data_ptr()],
            nbytes(host),
            codes,
            [out, host, keep],
            finish,
            [out],
            root,
        )

    # The collectives take the arguments torch's C++ trampoline passes them
    # (tensor lists and an options object: the "dispatch form"), not the
    # overloads of torch's Python stubs, hence the override ignores below.
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MooncakeWork:  # type: ignore[override]
        return self._inplace("all_reduce", tensors, opts, reduces=True, rooted=False)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> MooncakeWork:
        works = [self.allreduce([t], opts) for t in tensors]
        for w in works[:-1]:
            w.wait()
        return works[-1]

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> MooncakeWork:  # type: ignore[override]
        return self._inplace("broadcast", tensors, opts, reduces=False, rooted=True)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MooncakeWork:  # type: ignore[override]
        return self._inplace("reduce", tensors, opts, reduces=True, rooted=True)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> MooncakeWork:
        self._check_open()
        inp = self._single(input_tensors, "allgather input")
        outs = self._one_list(output_tensors, "allgather output")
        return self._collect("all_gather", inp, outs, "allgather output")

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> MooncakeWork:
        self._check_open()
        return self._collect("all_gather", input, output, "all_gather_into_tensor output")

    _allgather_base = all_gather_single

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> MooncakeWork:  # type: ignore[override]
        self._check_open()
        inp = self._single(input_tensors, "gather input")
        root, outs = self._root_list(opts, output_tensors, "gather", "output")
        return self._collect("gather", inp, outs, "gather output", root)

    def gather_single(self, output: Any, input: Any, opts: Any = None) -> MooncakeWork:
        self._check_open()
        root = self._root(opts)
        self._check_root(root)
        out = output if root == self._rank else None
        return self._collect("gather", input, out, "gather_into_tensor output", root)

    gather_into_tensor = gather_single

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: Any, input_tensors: Any, opts: Any = None
    ) -> MooncakeWork:
        self._check_open()
        out = self._single(output_tensors, "reduce_scatter output")
        ins = self._one_list(input_tensors, "reduce_scatter input")
        return self._spread("reduce_scatter", out, ins, "reduce_scatter input", opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> MooncakeWork:
        self._check_open()
        return self._spread("reduce_scatter", output, input, "reduce_scatter_tensor input", opts)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> MooncakeWork:  # type: ignore[override]
        self._check_open()
        out = self._single(output_tensors, "scatter output")
        root, ins = self._root_list(opts, input_tensors, "scatter", "input")
        return self._spread("scatter", out, ins, "scatter input", opts, root)

    def _all_to_all(
        self,
        srcs: list[tuple[int, int]],
        dsts: list[tuple[int, int]],
        dtype: torch.dtype,
        keep: list[Any],
        finish: list[Finish],
        result: list[torch.Tensor],
    ) -> MooncakeWork:
        n = self._native.submit(
            "all_to_all",
            [p for p, _ in srcs],
            [p for p, _ in dsts],
            0,
            _codes.dtype_code(dtype),
            0,
            0,
            [n for _, n in srcs],
            [n for _, n in dsts],
        )
        return self._work(n, keep, finish, result)

    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> MooncakeWork:
        self._check_open()
        if len(output_tensors) != len(input_tensors):
            raise ValueError(
                f"{self._name}: all_to_all got {len(output_tensors)} outputs and "
                f"{len(input_tensors)} inputs"
            )
        self._check_k(len(input_tensors), "all_to_all tensor list")
        ins = [self._check_tensor(t, f"all_to_all input[{i}]") for i, t in enumerate(input_tensors)]
        outs = [
            self._check_tensor(t, f"all_to_all output[{i}]") for i, t in enumerate(output_tensors)
        ]
        dts = {t.dtype for t in ins + outs}
        if len(dts) != 1:
            raise ValueError(f"{self._name}: all_to_all tensors must share one dtype, got {dts}")
        finish: list[Finish] = []
        srcs = [host_in(t) for t in ins]
        hosts = [host_out(t, finish) for t in outs]
        return self._all_to_all(
            [(s.data_ptr(), nbytes(s)) for s in srcs],
            [(h.data_ptr(), nbytes(h)) for h in hosts],
            ins[0].dtype,
            [ins, outs, srcs, hosts],
            finish,
            list(outs),
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> MooncakeWork:
        self._check_open()
        out = self._check_tensor(output, "all_to_all_single output")
        inp = self._check_tensor(input, "all_to_all_single input")
        if out.dtype != inp.dtype:
            raise ValueError(f"{self._name}: output dtype {out.dtype} != input dtype {inp.dtype}")
        # torch allows giving the splits of one side only: the other is even.
        ins_split = list(input_split_sizes or [])
        outs_split = list(output_split_sizes or [])
        k = len(ins_split) or len(outs_split) or self.getSize()
        self._check_k(k, "all_to_all_single splits")

        def ranges(t: torch.Tensor, host: torch.Tensor, given: list[int], what: str) -> Any:
            rows = t.shape[0] if t.dim() > 0 else 1
            if given:
                if len(given) != k:
                    raise ValueError(
                        f"{self._name}: {what} split list has {len(given)} entries, expected {k}"
                    )
                if sum(given) != rows or min(given) < 0:
                    raise ValueError(
                        f"{self._name}: {what} splits {given} do not sum to dim 0 ({rows})"
                    )
                sizes = [int(x) for x in given]
            elif rows % k != 0:
                raise ValueError(
                    f"{self._name}: {what} dim 0 ({rows}) is not divisible by {k} ranks"
                )
            else:
                sizes = [rows // k] * k
            row = (t.numel() // max(rows, 1)) * t.element_size()
            res, off, base = [], 0, host.data_ptr()
            for s in sizes:
                res.append((base + off * row, s * row))
                off += s
            return res

        finish: list[Finish] = []
        src = host_in(inp)
        s_in = ranges(inp, src, ins_split, "input")
        host = host_out(out, finish)
        s_out = ranges(out, host, outs_split, "output")
        return self._all_to_all(s_in, s_out, inp.dtype, [out, inp, src, host], finish, [out])

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def barrier(self, opts: Any = None) -> MooncakeWork:
        self._check_open()
        return self._submit("barrier", [], [], 0, (0, 0), [], [], [])

    # -------------------------------------------------------------------- P2P
    def _peer(self, peer: int, what: str) -> int:
        peer = int(peer)
        if not 0 <= peer < self.capacity:
            raise ValueError(
                f"{self._name}: {what} rank {peer} is outside the group (size {self.getSize()})"
            )
        if peer == self._rank:
            raise ValueError(f"{self._name}: {what} to/from self (rank {peer}) is not supported")
        return peer

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> MooncakeWork:
        self._check_open()
        t = self._single(tensors, "send")
        dst = self._peer(dstRank, "send")
        src = host_in(t)
        n = self._native.send(dst, src.data_ptr(), nbytes(src))
        return self._work(n, [t, src], [], [t])

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> MooncakeWork:
        self._check_open()
        t = self._single(tensors, "recv")
        src = self._peer(srcRank, "recv")
        finish: list[Finish] = []
        host = host_out(t, finish)
        n = self._native.recv(src, host.data_ptr(), nbytes(host))
        return self._work(n, [t, host], finish, [t])

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> MooncakeWork:
        self._check_open()
        t = self._single(tensors, "recv")
        finish: list[Finish] = []
        host = host_out(t, finish)
        n = self._native.recv(None, host.data_ptr(), nbytes(host))
        return self._work(n, [t, host], finish, [t])

    # ----------------------------------------------------------------- life
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Whether rank 0 is still a live member we may wait for (read before
        # the core stops).
        host_live = self._rank != 0 and self._native.is_active() and self._native.mask() & 1 == 1
        self._native.shutdown()
        for w in list(self._inflight.values()):
            w._finalize()
        self._inflight.clear()
        if self._default_group:
            _rendezvous.PROCESS_COORDINATOR[0] = None
        if self._coordinator is not None:
            self._coordinator.shutdown()
            self._coordinator = None
        watch, self._store_watch = self._store_watch, None
        if watch is not None:
            with watch:
                _rendezvous.await_store_close(watch, host_live)

    def abort(self) -> None:
        self.shutdown()

    # ------------------------------------------------------ mooncake extras
    @property
    def capacity(self) -> int:
        return int(self._native.capacity())

    def active_ranks(self) -> torch.Tensor:
        self._sync_mask()
        return self._mask_dev if self._mask_dev is not None else self._mask_host

    def shm_peer_count(self) -> int:
        return int(self._native.shm_peer_count())

    # ------------------------------------------------------ elastic membership
    def _adopt_capacity(self) -> None:
        """Resizes the mask mirror in place after the capacity grew."""
        cap = self.capacity
        if self._mask_host.numel() != cap:
            # resize_ may free the old storage: no core write may land there.
            self._native.clear_mask_tensor()
            self._mask_host.resize_(cap)
            self._native.set_mask_tensor(self._mask_host.data_ptr(), cap, self._mask_host)
            self._last_mask = -1
        self._sync_mask()

    def _extend(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"extend_group_size_to: size must be an int, got {size!r}")
        self._check_open()
        self._native.extend(size)
        self._adopt_capacity()

    def _ranks(self, ranks: Any, what: str) -> list[int]:
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise TypeError(f"{what}: ranks must be a list of ints, got {type(ranks).__name__}")
        out = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int):
                raise TypeError(f"{what}: ranks must be ints, got {r!r}")
            if not 0 <= r < self.capacity:
                raise ValueError(
                    f"{what}: rank {r} is outside the group's capacity {self.capacity}"
                )
            out.append(int(r))
        return out

    def _propose(self, activate: bool, ranks: Any) -> tuple[int, int, list[int], str]:
        what = "activate_ranks" if activate else "deactivate_ranks"
        self._check_open()
        rs = self._ranks(ranks, what)
        res = self._native.propose(activate, rs)
        self._adopt_capacity()
        return res

    def _join(self, timeout: Any = None) -> None:
        self._check_open()
        t = self._timeout if timeout is None else _rendezvous.timeout_s(timeout)
        self._native.join(t)
        self._adopt_capacity()

    def _peer_state(self, ranks: Any) -> list[bool]:
        return [bool(x) for x in self._native.peer_state(self._ranks(ranks, "get_peer_state"))]

    def _sync_after_failure(self) -> tuple[int, int, str]:
        self._check_open()
        res = self._native.sync()
        self._adopt_capacity()
        return res


def make_creator(backend_name: str, device_type: str) -> Callable[..., MooncakeProcessGroup]:
    """The ``extended_api=True`` creator torch calls with ``(opts, pg_options)``."""

    def _create(dist_opts: Any, pg_options: Any = None) -> MooncakeProcessGroup:
        return MooncakeProcessGroup(
            dist_opts.store,
            dist_opts.group_rank,
            dist_opts.group_size,
            dist_opts.timeout,
            str(dist_opts.group_id),
            backend_name,
            device_type,
            pg_options,
        )

    return _create
