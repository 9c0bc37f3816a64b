"""Console entry point for ``mooncake_master``: runs the Rust master in-process."""

import sys


def main() -> None:
    from mooncake import _native

    sys.exit(_native.run_master(sys.argv))
