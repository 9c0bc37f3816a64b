"""A real ``mooncake_client`` daemon (the standalone store client that
``setup_dummy`` clients attach to) for the suites that start one: the
console script next to ``sys.executable``, else on ``PATH``, else
``$MOONCAKE_CLIENT_BIN``, on a free port, mounted on a master (anything
with ``rpc_addr`` and ``metadata_url``), its output in a log file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from helpers.bins import console_script
from helpers.logged import LoggedProcess
from helpers.waits import free_port, wait_until


def client_bin() -> str:
    return console_script("mooncake_client", "MOONCAKE_CLIENT_BIN")


READY = "serving dummy clients"


class Daemon(LoggedProcess):
    """A real ``mooncake_client`` process."""

    def __init__(
        self,
        master: Any,
        tmpdir: Path,
        port: int | None = None,
        segment: str = "256MB",
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        wait: bool = True,
    ) -> None:
        self.master = master
        self.port = port or free_port()
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.argv = [
            client_bin(),
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--global_segment_size={segment}",
            f"--master_server_address={master.rpc_addr}",
            f"--metadata_server={master.metadata_url}",
            *extra,
        ]
        self.log_path = tmpdir / f"daemon-{self.port}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(wait)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> None:
        self.starts = getattr(self, "starts", 0) + 1
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        want = self.starts
        ok = wait_until(
            lambda: (
                self.log_text().count(READY) >= want
                or (self.proc is not None and self.proc.poll() is not None)
            ),
            timeout,
        )
        assert ok and self.alive(), f"daemon did not come up:\n{self.log_text()[-3000:]}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def restart(self) -> None:
        """SIGKILL the daemon (when it runs) and start a new one on the same
        port, trying again while the old one's port is still taken."""
        self.kill()
        deadline = time.monotonic() + 20
        while True:
            self.start(wait=False)
            ok = wait_until(
                lambda: self.log_text().count(READY) >= self.starts or not self.alive(), 20
            )
            if ok and self.alive():
                return
            assert time.monotonic() < deadline, self.log_text()[-3000:]
            time.sleep(0.2)
