"""Console entry point for ``mooncake_client``: runs the standalone store daemon in-process."""

import sys


def main() -> None:
    from mooncake import _native

    sys.exit(_native.run_client(sys.argv))
