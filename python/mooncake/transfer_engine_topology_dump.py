"""``transfer_engine_topology_dump``: print the transfer engine's view of
this host, as upstream's command does::

    Local topology [te/discover]: {
        "cpu:0" :
        [ ... ]
    }

Each memory location (``cpu:N`` per NUMA node) maps to ``[preferred
devices, other devices]``. This engine moves data by cross-process copies
and TCP and opens no RDMA device, so the device lists are empty (what
upstream prints on a host without a usable RDMA device). A custom topology
(``--custom-topo-json`` or ``MC_CUSTOM_TOPO_JSON`` with ``--use-custom-topo``)
replaces the memory locations. The ``tent`` backend selects the same view.
"""

from __future__ import annotations

import argparse
import os
import sys

from mooncake._cli import ArgumentParser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Upstream's flags: ``--device-name``, ``--backend``, ``--use-custom-topo``,
    ``--custom-topo-json``."""
    parser = ArgumentParser(
        prog="transfer_engine_topology_dump",
        description=(
            "Dump device topology for classic Transfer Engine or TENT. "
            "By default clears custom topology overrides so the output "
            "reflects auto-discovery. Use --use-custom-topo or "
            "--custom-topo-json to load a custom NIC priority matrix instead."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--device-name",
        type=str,
        default="",
        help="Filter topology by device name(s), comma-separated.",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "te", "tent"),
        default="auto",
        help="Topology backend: te=classic Transfer Engine, tent=Mooncake TENT, "
        "auto=follow MC_USE_TENT/MC_USE_TEV1",
    )
    parser.add_argument(
        "--use-custom-topo",
        action="store_true",
        help="Keep an existing MC_CUSTOM_TOPO_JSON override",
    )
    parser.add_argument(
        "--custom-topo-json",
        type=str,
        default=None,
        help="Path to custom topology JSON; sets MC_CUSTOM_TOPO_JSON",
    )
    return parser.parse_args(argv)


def resolve_backend(backend: str) -> str:
    """``auto`` follows ``MC_USE_TENT``/``MC_USE_TEV1``."""
    if backend == "auto":
        if os.environ.get("MC_USE_TENT") or os.environ.get("MC_USE_TEV1"):
            return "tent"
        return "te"
    return backend


def main(argv: list[str] | None = None) -> int:
    """Print the topology; exit 1 when ``--use-custom-topo`` has no file to use
    or the engine fails."""
    args = parse_args(argv)
    backend = resolve_backend(args.backend)
    if args.custom_topo_json is not None:
        os.environ["MC_CUSTOM_TOPO_JSON"] = args.custom_topo_json
        mode = f"custom ({args.custom_topo_json})"
    elif args.use_custom_topo:
        custom_path = os.environ.get("MC_CUSTOM_TOPO_JSON", "")
        if not custom_path:
            print("error: --use-custom-topo requires MC_CUSTOM_TOPO_JSON", file=sys.stderr)
            return 1
        mode = f"custom ({custom_path})"
    else:
        os.environ["MC_CUSTOM_TOPO_JSON"] = ""
        mode = "discover"
    try:
        from mooncake.engine import TransferEngine

        topo = TransferEngine().get_local_topology(device_name=args.device_name or None)
    except Exception as exc:  # noqa: BLE001 - reported as upstream does
        print(f"error: failed to dump topology: {exc}", file=sys.stderr)
        return 1
    print(f"Local topology [{backend}/{mode}]: ", end="")
    print(topo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
