"""In-process tests of the ``mooncake.pg`` surface: upstream's
``MooncakeBackendOptions`` overloads, the result types and enums, and the
argument checks that need no process group."""

from __future__ import annotations

import inspect
from typing import Any

import mooncake.pg as mpg
import pytest
import torch
from helpers.pg_surface import UPSTREAM_PG_FUNCTIONS
from mooncake.pg import MooncakeBackendOptions as Opts


def t(n: int = 4) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32)


MASK = t()

# (call, max_group_size, is_extension, auto_deactivate, auto_sync, has tensor)
FORMS: list[tuple[str, Any, int | None, bool, bool, bool, bool]] = [
    ("(4)", lambda: Opts(4), 4, False, True, True, False),
    ("(4, False)", lambda: Opts(4, False), 4, False, True, True, False),
    ("(4, True)", lambda: Opts(4, True), 4, True, True, True, False),
    ("(4, True, True, True)", lambda: Opts(4, True, True, True), 4, True, True, True, False),
    (
        "(4, False, False, False)",
        lambda: Opts(4, False, False, False),
        4,
        False,
        False,
        False,
        False,
    ),
    ("(4, False, True, False)", lambda: Opts(4, False, True, False), 4, False, True, False, False),
    ("(t)", lambda: Opts(MASK), None, False, True, True, True),
    ("(t, False)", lambda: Opts(MASK, False), None, False, True, True, True),
    ("(t, True, 4)", lambda: Opts(MASK, True, 4), 4, True, True, True, True),
    ("max_group_size=", lambda: Opts(max_group_size=4), 4, False, True, True, False),
    (
        "max_group_size=, is_extension=",
        lambda: Opts(max_group_size=4, is_extension=True),
        4,
        True,
        True,
        True,
        False,
    ),
    (
        "all four keywords",
        lambda: Opts(
            max_group_size=4,
            is_extension=False,
            auto_deactivate_on_failure=False,
            auto_sync_on_failure=False,
        ),
        4,
        False,
        False,
        False,
        False,
    ),
    ("(4, is_extension=)", lambda: Opts(4, is_extension=True), 4, True, True, True, False),
    ("active_ranks=", lambda: Opts(active_ranks=MASK), None, False, True, True, True),
    (
        "active_ranks=, is_extension=, max_group_size=",
        lambda: Opts(active_ranks=MASK, is_extension=True, max_group_size=4),
        4,
        True,
        True,
        True,
        True,
    ),
    ("(t, max_group_size=)", lambda: Opts(MASK, max_group_size=4), 4, False, True, True, True),
    ("seed max_world_size=", lambda: Opts(MASK, max_world_size=4), 4, False, True, True, True),
    (
        "auto_deactivate_on_failure=False alone",
        lambda: Opts(4, auto_deactivate_on_failure=False),
        4,
        False,
        False,
        False,
        False,
    ),
]


@pytest.mark.parametrize(
    ("make", "cap", "ext", "deact", "sync", "tensor"),
    [pytest.param(*f[1:], id=f[0]) for f in FORMS],
)
def test_options_forms(
    make: Any, cap: int | None, ext: bool, deact: bool, sync: bool, tensor: bool
) -> None:
    o = make()
    assert o.max_group_size == cap and o.max_world_size == cap
    assert o.is_extension is ext
    assert o.auto_deactivate_on_failure is deact
    assert o.auto_sync_on_failure is sync
    assert (o.active_ranks is MASK) if tensor else (o.active_ranks is None)
    assert o.isExtension_ is ext and o.maxWorldSize_ == cap  # seed aliases


def test_one_element_tensor_is_the_tensor_form() -> None:
    """A 1-element tensor selects the tensor overload (not int 1)."""
    one = torch.ones(1, dtype=torch.int32)
    o = Opts(one, False)
    assert o.active_ranks is one and o.max_group_size is None


def test_environment_default_for_auto_deactivate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOONCAKE_PG_AUTO_DEACTIVATE_ON_FAILURE", "0")
    o = Opts(4)
    assert not o.auto_deactivate_on_failure and not o.auto_sync_on_failure
    o = Opts(4, False, True, True)  # explicit arguments win
    assert o.auto_deactivate_on_failure and o.auto_sync_on_failure


BAD: list[tuple[str, Any, type[BaseException], str]] = [
    (
        "auto_sync without auto_deactivate",
        lambda: Opts(4, False, False, True),
        ValueError,
        "requires auto_deactivate_on_failure",
    ),
    (
        "auto_sync without auto_deactivate (keywords)",
        lambda: Opts(max_group_size=4, auto_deactivate_on_failure=False, auto_sync_on_failure=True),
        ValueError,
        "requires auto_deactivate_on_failure",
    ),
    ("five positionals", lambda: Opts(4, False, True, True, True), TypeError, "at most 4"),
    ("four tensor positionals", lambda: Opts(MASK, False, 4, True), TypeError, "at most 3"),
    ("string first", lambda: Opts("4"), TypeError, "first argument"),
    ("bool first", lambda: Opts(True), TypeError, "first argument"),
    ("float first", lambda: Opts(4.0), TypeError, "first argument"),
    ("unknown keyword", lambda: Opts(4, colour="red"), TypeError, "unexpected keyword"),
    ("twice", lambda: Opts(4, max_group_size=4), TypeError, "multiple values"),
    ("capacity 0", lambda: Opts(0), ValueError, "[1, 64]"),
    ("capacity 65", lambda: Opts(65), ValueError, "[1, 64]"),
    ("capacity as str", lambda: Opts(MASK, False, "4"), TypeError, "must be an int"),
    ("int64 mask", lambda: Opts(torch.zeros(4, dtype=torch.int64)), ValueError, "int32"),
    ("2-D mask", lambda: Opts(torch.zeros(2, 2, dtype=torch.int32)), ValueError, "1-D"),
    (
        "strided mask",
        lambda: Opts(torch.zeros(8, dtype=torch.int32)[::2]),
        ValueError,
        "contiguous",
    ),
    ("empty mask", lambda: Opts(torch.zeros(0, dtype=torch.int32)), ValueError, "entries"),
    ("mask vs capacity", lambda: Opts(t(5), False, 4), ValueError, "max_group_size is 4"),
    ("aliases disagree", lambda: Opts(max_group_size=4, max_world_size=5), ValueError, "disagree"),
    ("is_extension as str", lambda: Opts(4, "yes"), TypeError, "must be a bool"),
    ("active_ranks as list", lambda: Opts(active_ranks=[1, 1]), TypeError, "torch.Tensor"),
]


@pytest.mark.parametrize(("make", "exc", "needle"), [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_options_bad_input(make: Any, exc: type[BaseException], needle: str) -> None:
    with pytest.raises(exc) as e:
        make()
    assert needle in str(e.value), str(e.value)


def test_surface_matches_upstream() -> None:
    for name in UPSTREAM_PG_FUNCTIONS:
        assert callable(getattr(mpg, name)), name
        assert name in mpg.__all__, name
    assert mpg.recover_ranks is mpg.activate_ranks
    assert mpg.ViewUpdateStatus is mpg.ProposalStatus
    assert [(m.name, int(m)) for m in mpg.ProposalStatus] == [
        ("Rejected", 0),
        ("Applied", 1),
        ("AppliedWithDroppedRanks", 2),
    ]
    assert [(m.name, int(m)) for m in mpg.SyncAfterFailureStatus] == [
        ("Reconciled", 0),
        ("NoPending", 1),
        ("Rejected", 2),
    ]
    for name, want in UPSTREAM_PG_FUNCTIONS.items():
        sig = inspect.signature(getattr(mpg, name))
        assert list(sig.parameters) == want, (name, sig)
    assert inspect.signature(mpg.join_group).parameters["timeout"].default is None


def test_result_types() -> None:
    r = mpg.ProposeViewUpdateResponse(mpg.ProposalStatus.AppliedWithDroppedRanks, 3, [2], "")
    assert (r.status, r.new_epoch, r.dropped_ranks, r.reject_reason) == (
        mpg.ProposalStatus.AppliedWithDroppedRanks,
        3,
        [2],
        "",
    )
    assert "AppliedWithDroppedRanks" in repr(r)
    with pytest.raises(AttributeError):
        r.status = mpg.ProposalStatus.Applied  # type: ignore[misc]
    s = mpg.SyncAfterFailureResponse(mpg.SyncAfterFailureStatus.Rejected, "no coordinator")
    assert s.status == mpg.SyncAfterFailureStatus.Rejected and s.reject_reason == "no coordinator"


@pytest.mark.parametrize(
    "call",
    [
        lambda: mpg.get_active_ranks("nope"),
        lambda: mpg.get_num_synced_ranks(None),
        lambda: mpg.extend_group_size_to(object(), 4),
        lambda: mpg.get_peer_state(1, [0]),
        lambda: mpg.activate_ranks("g", [1]),
        lambda: mpg.deactivate_ranks("g", [1]),
        lambda: mpg.join_group(3.0),
        lambda: mpg.get_current_epoch("x"),
        lambda: mpg.sync_after_failure([]),
        lambda: mpg.get_failed_ranks_hint(object()),
        lambda: mpg.get_local_success(None),
        lambda: mpg.set_transfer_engine(object()),
        lambda: mpg.set_host_ip(127),
        lambda: mpg.set_device_filter("mlx5_0"),
    ],
)
def test_bad_arguments_raise_type_error(call: Any) -> None:
    with pytest.raises(TypeError):
        call()


def test_process_settings_accept_valid_values() -> None:
    mpg.set_transfer_engine(None)
    mpg.set_device_filter(["mlx5_0"])
    mpg.set_host_ip("127.0.0.1")
    mpg.set_host_ip("")
    mpg.set_fault_reconciliation_window_us(5_000_000)
    mpg.set_fault_reconciliation_window_us(0)
