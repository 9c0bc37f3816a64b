"""Batched store calls with clear errors.

Writes go to the store in one batched call and a failed write removes what
it wrote; reads copy fragments of stored objects into destination memory in
one ``get_into_ranges`` call. A missing object raises
:class:`StructuredObjectMissingError`.
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MISSING_OBJECT_ERROR = -704
LEASE_EXPIRED = -707
_READ_ATTEMPTS = 4


class StructuredObjectMissingError(KeyError):
    """A manifest or member object is no longer in the store (cleaned up or evicted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "object missing"


@dataclass
class _Obj:
    """One store object to write: its bytes as pieces of memory."""

    key: str
    pieces: list[tuple[int, int]]
    label: str


@dataclass
class _ReadGroup:
    """Fragments read into one destination buffer."""

    ptr: int
    size: int
    label: str
    frags: list[tuple[str, int, int, int]]  # key, dst offset, src offset, size
    pre_registered: bool = False


class _Transport:
    """Batched store calls with clear errors.

    On a ``MooncakeDistributedStore`` every write is one
    ``batch_put_from_multi_buffers`` call and every read one
    ``get_into_ranges`` call. Other stores (wrappers implementing only part
    of the API, at least ``put``/``get``/``remove``) get the same results
    through the calls they have.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def _has(self, name: str) -> bool:
        return callable(getattr(self.store, name, None))

    def write(self, objs: Sequence[_Obj], config: Any) -> None:
        """Write every object in one batched call; on failure remove what was
        written and raise naming the members."""
        if not objs:
            return
        keys = [o.key for o in objs]
        cfg = _config_for(config, len(keys))
        extra = () if cfg is None else (cfg,)
        if self._has("batch_put_from_multi_buffers"):
            ptrs = [[p for p, _n in o.pieces] for o in objs]
            sizes = [[n for _p, n in o.pieces] for o in objs]
            results = self.store.batch_put_from_multi_buffers(keys, ptrs, sizes, *extra)
            op = "batch_put_from_multi_buffers"
        elif self._has("batch_put_from") and all(len(o.pieces) == 1 for o in objs):
            results = self.store.batch_put_from(
                keys, [o.pieces[0][0] for o in objs], [o.pieces[0][1] for o in objs], *extra
            )
            op = "batch_put_from"
        else:
            one = () if config is None else (_config_for(config, 1),)
            results = []
            for o in objs:
                try:
                    results.append(self.store.put(o.key, _gather(o.pieces), *one))
                except Exception:  # noqa: BLE001 - a failed put is a failed write
                    results.append(-1)
            op = "put"
        self._check_writes(objs, list(results), op)

    def write_tensor_objects(self, objs: Sequence[_Obj], config: Any) -> None:
        """Caller tensor objects (``tensor_object_buffer``) through the native
        tensor path, which validates their headers."""
        if not objs:
            return
        keys = [o.key for o in objs]
        ptrs = [o.pieces[0][0] for o in objs]
        sizes = [o.pieces[0][1] for o in objs]
        if config is None and self._has("batch_put_tensor_from"):
            results = self.store.batch_put_tensor_from(keys, ptrs, sizes)
        elif config is None and self._has("put_tensor_from"):
            results = [
                self.store.put_tensor_from(k, p, n)
                for k, p, n in zip(keys, ptrs, sizes, strict=True)
            ]
        elif self._has("put_from"):
            cfg = () if config is None else (_config_for(config, 1),)
            results = [
                self.store.put_from(k, p, n, *cfg)
                for k, p, n in zip(keys, ptrs, sizes, strict=True)
            ]
        else:
            self.write(objs, config)
            return
        self._check_writes(objs, list(results), "put_tensor_from")

    def _check_writes(self, objs: Sequence[_Obj], results: Sequence[Any], op: str) -> None:
        failed = [(o, r) for o, r in zip(objs, results, strict=True) if r not in (0, None)]
        if len(results) != len(objs):
            failed = [(o, -1) for o in objs]
        if failed:
            self.remove([o.key for o in objs], strict=False)
            named = ", ".join(f"{o.label} (code {r})" for o, r in failed[:4])
            raise RuntimeError(
                f"{op} failed for {len(failed)} object(s): {named}; nothing was kept"
            )

    def remove(self, keys: Sequence[str], strict: bool) -> None:
        pending = list(dict.fromkeys(keys))
        if not pending:
            return
        bad: list[tuple[str, Any]] = []
        if self._has("batch_remove"):
            try:
                results = list(self.store.batch_remove(pending, True))
            except TypeError:
                results = list(self.store.batch_remove(pending))
            bad = [
                (k, r)
                for k, r in zip(pending, results, strict=True)
                if r not in (0, None, MISSING_OBJECT_ERROR)
            ]
            pending = [k for k, _r in bad]
            bad = []
        for k in pending:
            try:
                r = self.store.remove(k, True)
            except KeyError:
                continue
            except Exception as exc:  # noqa: BLE001 - reported below
                r = str(exc)
            if r not in (0, None, MISSING_OBJECT_ERROR):
                bad.append((k, r))
        if bad and strict:
            raise RuntimeError(f"failed to remove {len(bad)} Mooncake keys: {bad[:3]}")

    def get_blobs(self, keys: Sequence[str]) -> list[bytes]:
        if not keys:
            return []
        if self._has("get_batch"):
            return list(self.store.get_batch(list(keys)))
        out = []
        for k in keys:
            try:
                out.append(bytes(self.store.get(k)))
            except KeyError:
                out.append(b"")
        return out

    def read(self, groups: Sequence[_ReadGroup]) -> None:
        """Run every group's fragments in one ``get_into_ranges`` call.

        A copy that outlived its read lease (LEASE_EXPIRED, a slow copy on a
        loaded host) is discarded by the store; those groups are read again,
        one call each, up to four attempts in all (objects are write-once, so
        a repeated read returns the same bytes)."""
        groups = [g for g in groups if g.frags]
        if not groups:
            return
        if not self._has("get_into_ranges"):
            self._read_with_get(groups)
            return
        retry = self._read_once(groups)
        for attempt in range(1, _READ_ATTEMPTS):
            if not retry:
                return
            retry = [
                g
                for group in retry
                for g in self._read_once([group], last=attempt == _READ_ATTEMPTS - 1)
            ]

    def _read_once(self, groups: Sequence[_ReadGroup], last: bool = False) -> list[_ReadGroup]:
        """One ``get_into_ranges`` call; the groups to read again (lease expired)."""
        registered: list[int] = []
        can_register = self._has("register_buffer") and self._has("unregister_buffer")
        try:
            for g in groups:
                if not can_register or g.pre_registered or g.size == 0:
                    continue
                if self.store.register_buffer(g.ptr, g.size) == 0:
                    registered.append(g.ptr)
            ptrs: list[int] = []
            all_keys: list[list[str]] = []
            dsts: list[list[list[int]]] = []
            srcs: list[list[list[int]]] = []
            sizes: list[list[list[int]]] = []
            for g in groups:
                by_key: dict[str, tuple[list[int], list[int], list[int]]] = {}
                for key, dst, src, n in g.frags:
                    entry = by_key.setdefault(key, ([], [], []))
                    entry[0].append(dst)
                    entry[1].append(src)
                    entry[2].append(n)
                ptrs.append(g.ptr)
                all_keys.append(list(by_key))
                dsts.append([v[0] for v in by_key.values()])
                srcs.append([v[1] for v in by_key.values()])
                sizes.append([v[2] for v in by_key.values()])
            try:
                results = self.store.get_into_ranges(ptrs, all_keys, dsts, srcs, sizes)
            except KeyError as exc:
                raise StructuredObjectMissingError(
                    f"{groups[0].label}: object {exc} is missing (cleaned up or evicted)"
                ) from None
        finally:
            for p in registered:
                self.store.unregister_buffer(p)
        again: list[_ReadGroup] = []
        for g, keys, want, got in zip(groups, all_keys, sizes, results, strict=True):
            for key, w, r in zip(keys, want, got, strict=True):
                if list(r) != list(w):
                    codes = sorted({c for c in r if c < 0})
                    if MISSING_OBJECT_ERROR in codes:
                        raise StructuredObjectMissingError(
                            f"{g.label}: object {key!r} is missing (cleaned up or evicted)"
                        )
                    if codes == [LEASE_EXPIRED] and not last:
                        again.append(g)
                        break
                    raise RuntimeError(f"{g.label}: reading {key!r} failed (codes {codes or r})")
        return again

    def _read_with_get(self, groups: Sequence[_ReadGroup]) -> None:
        cache: dict[str, bytes] = {}
        for g in groups:
            for key, dst, src, n in g.frags:
                if key not in cache:
                    try:
                        cache[key] = bytes(self.store.get(key))
                    except KeyError:
                        cache[key] = b""
                data = cache[key]
                if len(data) < src + n:
                    if not data:
                        raise StructuredObjectMissingError(
                            f"{g.label}: object {key!r} is missing (cleaned up or evicted)"
                        )
                    raise RuntimeError(
                        f"{g.label}: object {key!r} is shorter than its manifest says"
                    )
                ctypes.memmove(g.ptr + dst, data[src : src + n], n)


def _gather(pieces: Sequence[tuple[int, int]]) -> bytes:
    """The concatenated bytes of ``pieces`` (for stores without pointer writes)."""
    return b"".join(ctypes.string_at(p, n) for p, n in pieces)


def _config_for(config: Any, n: int) -> Any:
    """``config`` for a batch of ``n`` keys: one caller group id expanded."""
    if config is None:
        return None
    ids = getattr(config, "group_ids", None)
    if not ids:
        return config
    ids = [ids] if isinstance(ids, str) else list(ids)
    if len(ids) != 1:
        raise ValueError(
            "structured object store config.group_ids must contain exactly one logical group id"
        )
    cfg = copy.copy(config)
    cfg.group_ids = ids * n
    return cfg
