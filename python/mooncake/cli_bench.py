"""Console entry point for ``transfer_engine_bench`` (upstream's module name):
runs the benchmark (``mooncake-bench``, over this build's transfer engine)
in-process with upstream's gflags."""

import sys


def main() -> int:
    from mooncake import _native

    return _native.run_transfer_engine_bench(sys.argv)


if __name__ == "__main__":
    sys.exit(main())
