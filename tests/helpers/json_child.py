"""The test side of a child process driven by JSON lines: one request a line
on its stdin, one reply a line on its stdout (``{"ok": ..., "result": ...}``
or ``{"ok": false, "error": ...}``), a first line ``{"ready": true}``, and
``{"op": "exit"}`` to make it close and exit."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class PipedJsonChild:
    """A child process started with this process's environment plus ``env``,
    sent one JSON request a line on its stdin and answering with one JSON line
    on its stdout (text mode). Subclasses decode and check the replies."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def _send(self, req: dict[str, Any]) -> str:
        """Writes ``req`` as one line; the reply line ("" when the child exited)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class JsonLineChild:
    """Subclasses set ``log_path`` and start the process with ``_spawn``, and
    name themselves in error messages with ``name``."""

    proc: subprocess.Popen[bytes]
    _buf: bytes
    log_path: Path
    error: type[Exception] = AssertionError
    chunk = 1 << 20

    def name(self) -> str:
        raise NotImplementedError

    def log_tail(self) -> str:
        raise NotImplementedError

    def _spawn(
        self,
        popen: Callable[..., subprocess.Popen[bytes]],
        argv: list[str],
        env: dict[str, str] | None,
        cwd: str,
        ready_timeout: float,
    ) -> None:
        """Starts ``argv`` with ``popen`` (``subprocess.Popen`` or a wrapper),
        this process's environment plus ``env`` and unbuffered output, its
        stderr to ``log_path``; waits for its ready line."""
        full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=full_env,
                cwd=cwd,
            )
        self._buf = b""
        self.wait_ready(ready_timeout)

    def _fail(self, why: str) -> Exception:
        return self.error(f"{self.name()} {why}; log:\n{self.log_tail()}")

    def _readline(self, timeout: float) -> dict[str, Any]:
        """The next reply; raises when ``timeout`` passes or the process exits first."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"timed out after {timeout}s")
                if not sel.select(min(left, 0.5)):
                    if self.proc.poll() is not None:
                        raise self._fail(f"exited rc={self.proc.returncode}")
                    continue
                chunk = os.read(self.proc.stdout.fileno(), self.chunk)
                if not chunk:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=5)
                    raise self._fail(f"exited rc={self.proc.returncode}")
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self, timeout: float) -> None:
        hello = self._readline(timeout)
        assert hello.get("ready"), hello

    def call(self, op: str, timeout: float = 60.0, **kw: Any) -> Any:
        """Runs ``op`` with arguments ``kw``; its result, or raises with its error."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(dict(kw, op=op)) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._readline(timeout)
        if not reply.get("ok"):
            raise self.error(f"{op} failed in {self.name()}: {reply.get('error')}")
        return reply.get("result")

    def ask_exit(self, timeout: float = 15.0) -> None:
        """Asks the process to close and exit, and waits up to ``timeout`` for it."""
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)


def serve(client: Any) -> None:
    """The child's side: prints ``{"ready": true}``, then answers each request
    line with ``client.op_NAME(request)`` (an error reply when it raises or
    there is no such op) until ``{"op": "exit"}`` or EOF. The caller closes
    what ``client`` holds afterwards."""
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        op = msg.get("op")
        if op == "exit":
            break
        fn = getattr(client, f"op_{op}", None)
        try:
            if fn is None:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "result": fn(msg)}
        except Exception as e:  # noqa: BLE001 - reported to the test, keep serving
            reply = {"ok": False, "error": f"{e!r}\n{traceback.format_exc()}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
