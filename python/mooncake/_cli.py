"""Shared pieces of the console scripts: argument parsing that exits with
status 1 naming the offending flag (unknown flag, missing or malformed
value), and value types for ports and log levels."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

# Python logging level names (upstream's --log-level choices) and the Rust
# log filter each one selects.
LOG_LEVELS = {
    "DEBUG": "debug",
    "INFO": "info",
    "WARNING": "warn",
    "ERROR": "error",
    "CRITICAL": "error",
}


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors exit with status 1."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def port(text: str) -> int:
    """A TCP port number, 0 to 65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r} (0-65535)")
    return value
