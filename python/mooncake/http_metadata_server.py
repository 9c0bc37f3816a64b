"""HTTP metadata server for Mooncake (``mooncake_http_metadata_server``).

The standalone form of the metadata service ``mooncake_master`` embeds with
``--enable_http_metadata_server``: the same Rust server (``GET``/``PUT``/
``DELETE /metadata?key=K``, ``GET /health``), with the same codes, including
the rule that an ``rpc_meta`` key keeps its first value. Transfer engines and
store clients use it as their ``metadata_server``
(``http://host:port/metadata``) instead of etcd.

Run it as upstream's command::

    mooncake_http_metadata_server --host 0.0.0.0 --port 8080 --log-level INFO

or in a process, as upstream's ``KVBootstrapServer``::

    server = KVBootstrapServer(port=8080)
    server.run()                      # serves in the background
    assert server.poll() == KVPoll.Success
    server.close()

With ``MC_AUTH_TOKEN``/``MC_AUTH_TOKEN_FILE`` set, writes must be signed as on
the master (see the README's Security section).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from enum import Enum

from mooncake import _native
from mooncake._cli import LOG_LEVELS, ArgumentParser, port

log = logging.getLogger("mooncake.http_metadata_server")


class KVPoll(Enum):
    """Status of the server (upstream's values)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVBootstrapServer:
    """The metadata server on ``host:port``, serving in the background after
    :meth:`run` until :meth:`close`."""

    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        self.port = port
        self.host = host
        self.thread: threading.Thread | None = None
        self._server: _native.MetadataServer | None = None

    def run(self) -> threading.Thread:
        """Start serving; returns the thread that lives while the server does.
        When the address cannot be bound the error is logged and :meth:`poll`
        answers ``KVPoll.Failed``."""
        try:
            self._server = _native.MetadataServer(self.host, self.port)
        except OSError as e:
            log.error("Server error: %s", e)
            self.thread = threading.Thread(target=lambda: None, daemon=True)
            self.thread.start()
            self.thread.join()
            return self.thread
        server = self._server
        self.thread = threading.Thread(target=server.wait, daemon=True)
        self.thread.start()
        log.info("HTTP Metadata Server started on %s:%s", self.host, server.port)
        return self.thread

    def close(self) -> None:
        """Stop serving and wait (up to 2 s) for the thread to end."""
        if self._server is not None:
            self._server.stop()
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=2)

    def poll(self) -> KVPoll:
        """``KVPoll.Success`` while serving, else ``KVPoll.Failed``."""
        if self.thread is None or not self.thread.is_alive():
            return KVPoll.Failed
        return KVPoll.Success


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Upstream's flags: ``--port`` (8080), ``--host`` (0.0.0.0), ``--log-level``."""
    parser = ArgumentParser(
        prog="mooncake_http_metadata_server",
        description="HTTP Metadata Server for Mooncake",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--port", type=port, default=8080, help="Port to listen on")
    parser.add_argument("--host", type=str, default="0.0.0.0", help="Host to bind to")
    parser.add_argument(
        "--log-level",
        type=str,
        choices=list(LOG_LEVELS),
        default="INFO",
        help="Logging level",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM (exit 0); exit 1 when the address cannot
    be bound (a port in use, a host not of this machine)."""
    args = parse_args(argv)
    return _native.run_http_metadata_server(args.host, args.port, LOG_LEVELS[args.log_level])


if __name__ == "__main__":
    sys.exit(main())
