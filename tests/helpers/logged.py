"""A process the tests started, with its output in a log file."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


class LoggedProcess:
    """Subclasses set ``proc`` (None until started) and ``log_path``."""

    proc: subprocess.Popen[Any] | None
    log_path: Path

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        """The whole log so far ("" when it cannot be read)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
