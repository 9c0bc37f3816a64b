"""Mooncake store service with a REST API (``mc_store_rest_server``).

A store client (``MooncakeDistributedStore``) set up from a config file
(``--config``), or from the ``MOONCAKE_*`` environment variables, with
``-Dfield=value`` overrides, and upstream's REST routes in front of it::

    PUT    /api/put                {"key": k, "value": "text"}  -> {"status": "success"}
    GET    /api/get/<key>          the value's bytes (application/octet-stream), 404 if absent
    GET    /api/exist/<key>        {"exists": true|false}
    DELETE /api/remove/<key>       {"status": "success"}
    DELETE /api/remove_all         {"status": "success removed N keys"}
    POST   /api/mount, /api/unmount, /api/mount_shm, /api/unmount_shm,
           /api/unmount_local_disk, /api/reconfigure  (segment management)

Errors are JSON ``{"error": "..."}`` with upstream's status codes (400 for a
missing field, 404 for a missing key, 500 when the store call fails). A body
that is not a JSON object is a 400 here on every route. The store is set up
first, retrying each second for up to ``--max-wait-time`` seconds; the HTTP
port is bound before that, so a port in use fails at once (exit 1).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from mooncake._cli import ArgumentParser, port
from mooncake.mooncake_config import MooncakeConfig
from mooncake.store import MooncakeDistributedStore

log = logging.getLogger("mooncake.store_service")

# Largest request body accepted (upstream's client_max_size).
MAX_BODY = 100 * 1024 * 1024
# Upper bound of /api/unmount_local_disk's grace period (seconds).
_MAX_UNMOUNT_LOCAL_DISK_GRACE_PERIOD_SECONDS = 3600


class BadRequest(Exception):
    """A request the service refuses with 400 and this message."""


class Reply:
    """A response: status, body bytes and content type."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type

    @staticmethod
    def json(status: int, payload: Any) -> Reply:
        return Reply(status, json.dumps(payload).encode(), "application/json")


def _error(status: int, message: str, **extra: Any) -> Reply:
    return Reply.json(status, {"error": message, **extra})


def _ok(**fields: Any) -> Reply:
    return Reply.json(200, {"status": "success", **fields})


def _shm_name_to_path(name: Any) -> str | None:
    """``/dev/shm/<name>`` for a plain shared-memory object name, else None."""
    if not isinstance(name, str) or not name:
        return None
    normalized = name.removeprefix("/")
    if not normalized or "/" in normalized or normalized in {".", ".."}:
        return None
    return f"/dev/shm/{normalized}"


def _ret_of(result: Any) -> tuple[int, list[Any], Any]:
    """``(ret, segment_ids, allocated_size)`` of a mount call's result."""
    if isinstance(result, dict):
        return (
            int(result.get("ret", -1)),
            list(result.get("segment_ids", [])),
            result.get("allocated_size"),
        )
    return int(result), [], None


class MooncakeStoreService:
    """The store client and the REST handlers in front of it."""

    def __init__(self, config_path: str | None = None, cli_config: dict[str, str] | None = None):
        self.store: MooncakeDistributedStore | None = None
        # State of /api/reconfigure (prefill/decode switch).
        self.current_mode = "prefill"
        self.mounted_segment_ids: list[Any] = []
        self.last_mount_info: dict[str, Any] = {}
        self._state_lock = threading.Lock()
        if config_path:
            self.config = MooncakeConfig.from_file(config_path)
        else:
            self.config = MooncakeConfig.load_from_env()
        for key, value in (cli_config or {}).items():
            if hasattr(self.config, key):
                setattr(self.config, key, value)
            else:
                log.warning("Ignoring unknown config key: %s", key)
        log.info("Mooncake configuration loaded")

    # ------------------------------------------------------------ lifecycle

    def setup_config(self) -> dict[str, Any]:
        """The ``setup(dict)`` argument (sizes may be strings such as ``"1GB"``)."""
        c = self.config
        return {
            "local_hostname": c.local_hostname,
            "metadata_server": c.metadata_server,
            "global_segment_size": c.global_segment_size,
            "local_buffer_size": c.local_buffer_size,
            "protocol": c.protocol,
            "rdma_devices": c.device_name,
            "master_server_addr": c.master_server_address,
            **c.setup_kwargs(),
        }

    def start_store_service(
        self, max_wait_time: float = 60, shutdown_event: threading.Event | None = None
    ) -> bool:
        """Set up the store, retrying each second for up to ``max_wait_time``
        seconds (or until ``shutdown_event`` is set). True once it is up."""
        start = time.perf_counter()
        attempt = 0
        while True:
            if shutdown_event is not None and shutdown_event.is_set():
                log.info("Store startup cancelled by shutdown request")
                return False
            elapsed = time.perf_counter() - start
            if elapsed >= max_wait_time:
                log.error(
                    "Store startup failed: exceeded max wait time of %ss after %d attempts",
                    max_wait_time,
                    attempt,
                )
                return False
            attempt += 1
            log.info(
                "Attempting to start store service (attempt %d, elapsed: %.1fs/%ss)",
                attempt,
                elapsed,
                max_wait_time,
            )
            store = MooncakeDistributedStore()
            ret = store.setup(self.setup_config())
            if ret == 0:
                self.store = store
                log.info("Store service started successfully on %s", self.config.local_hostname)
                return True
            remaining = max_wait_time - (time.perf_counter() - start)
            pause = min(1.0, remaining) if remaining > 0 else 0.0
            log.warning(
                "Store startup failed (attempt %d): setup returned %s. Retrying in %.1fs... "
                "(remaining time: %.1fs)",
                attempt,
                ret,
                pause,
                max(remaining, 0.0),
            )
            if pause > 0:
                if shutdown_event is not None:
                    if shutdown_event.wait(pause):
                        log.info("Store startup cancelled by shutdown request")
                        return False
                else:
                    time.sleep(pause)

    def stop(self) -> None:
        """Close the store client."""
        if self.store is not None:
            ret = self.store.close()
            self.store = None
            if ret != 0:
                log.warning("Mooncake service close returned %s", ret)
            else:
                log.info("Mooncake service stopped")

    # ------------------------------------------------------------ routing

    def routes(self) -> dict[tuple[str, str], Callable[..., Reply]]:
        """``(method, route) -> handler``; routes ending in ``/`` take the key."""
        return {
            ("POST", "/api/reconfigure"): self.handle_reconfigure,
            ("POST", "/api/mount_shm"): self.handle_mount_shm,
            ("POST", "/api/unmount_shm"): self.handle_unmount_shm,
            ("POST", "/api/mount"): self.handle_mount,
            ("POST", "/api/unmount"): self.handle_unmount,
            ("POST", "/api/unmount_local_disk"): self.handle_unmount_local_disk,
            ("PUT", "/api/put"): self.handle_put,
            ("GET", "/api/get/"): self.handle_get,
            ("GET", "/api/exist/"): self.handle_exist,
            ("DELETE", "/api/remove/"): self.handle_remove,
            ("DELETE", "/api/remove_all"): self.handle_remove_all,
        }

    def dispatch(self, method: str, raw_path: str, body: bytes) -> Reply:
        """The reply to one request (404/405 for other paths and methods)."""
        path = urlsplit(raw_path).path
        routes = self.routes()
        matched_path = False
        for (m, route), handler in routes.items():
            if route.endswith("/"):
                if not path.startswith(route):
                    continue
                segment = path[len(route) :]
                if not segment or "/" in segment:
                    continue
                matched_path = True
                if m == method:
                    return self._run(handler, unquote(segment))
            elif path == route:
                matched_path = True
                if m == method:
                    return self._run(handler, body)
        if matched_path:
            return Reply(405, b"405: Method Not Allowed", "text/plain")
        return Reply(404, b"404: Not Found", "text/plain")

    def _run(self, handler: Callable[[Any], Reply], arg: Any) -> Reply:
        name = handler.__name__.removeprefix("handle_").upper()
        start = time.perf_counter()
        try:
            return handler(arg)
        except BadRequest as e:
            return _error(400, str(e))
        except Exception as e:  # noqa: BLE001 - any store failure is a 500 reply
            log.error("%s error: %s", name, e)
            return _error(500, str(e))
        finally:
            ms = (time.perf_counter() - start) * 1000
            log.info("%s operation completed in %.2f ms", name, ms)

    @staticmethod
    def _object(body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("Malformed JSON body") from None
        if not isinstance(data, dict):
            raise BadRequest("Request body must be a JSON object")
        return data

    def _unmount_request(self, body: bytes) -> tuple[list[Any], Any] | None:
        """The ``segment_ids`` (a lone string names one segment) and
        ``grace_period_seconds`` (default 0) of an unmount request; None when
        it names no segment."""
        data = self._object(body)
        segment_ids = data.get("segment_ids", [])
        if isinstance(segment_ids, str):
            segment_ids = [segment_ids]
        if not segment_ids:
            return None
        return segment_ids, data.get("grace_period_seconds", 0)

    def _store(self) -> MooncakeDistributedStore:
        if self.store is None:
            raise RuntimeError("the store is not set up")
        return self.store

    # ------------------------------------------------------------ key-value routes

    def handle_put(self, body: bytes) -> Reply:
        data = self._object(body)
        key, raw_value = data.get("key"), data.get("value")
        if not key or raw_value is None:
            return _error(400, "Missing key or value")
        if not isinstance(key, str) or not isinstance(raw_value, str):
            return _error(400, "key and value must be strings")
        if self._store().put(key, raw_value.encode()) != 0:
            return _error(500, "PUT operation failed")
        return _ok()

    def handle_get(self, key: str) -> Reply:
        store = self._store()
        exists = store.is_exist(key)
        if exists == 0:
            return _error(404, "Key not found")
        if exists < 0:
            return _error(500, "Exist check failed")
        value = store.get(key)
        if value is None:
            return _error(500, "GET operation failed")
        if value == b"":
            exists = store.is_exist(key)
            if exists == 0:
                return _error(404, "Key not found")
            if exists < 0:
                return _error(500, "Exist check failed")
        return Reply(200, bytes(value), "application/octet-stream")

    def handle_exist(self, key: str) -> Reply:
        exists = self._store().is_exist(key)
        if exists < 0:
            return _error(500, "Exist check failed")
        return Reply.json(200, {"exists": exists > 0})

    def handle_remove(self, key: str) -> Reply:
        if self._store().remove(key) != 0:
            return _error(500, "Remove operation failed")
        return _ok()

    def handle_remove_all(self, _body: bytes) -> Reply:
        ret = self._store().remove_all()
        if ret < 0:
            return _error(500, "RemoveAll operation failed")
        return Reply.json(200, {"status": f"success removed {ret} keys"})

    # ------------------------------------------------------------ segment routes

    def handle_mount(self, body: bytes) -> Reply:
        data = self._object(body)
        size = data.get("size")
        protocol = data.get("protocol", self.config.protocol)
        location = data.get("location", "")
        if type(size) is not int or size <= 0:
            return _error(400, "Invalid size, must be a positive integer")
        ret, ids, allocated = _ret_of(
            self._store().allocate_and_mount_segment(size, protocol, location)
        )
        if ret != 0:
            return _error(500, f"Allocate and mount failed, ret={ret}")
        return _ok(segment_ids=ids, allocated_size=allocated)

    def handle_unmount(self, body: bytes) -> Reply:
        request = self._unmount_request(body)
        if request is None:
            return _error(400, "Missing segment_ids")
        segment_ids, grace = request
        ret = self._store().unmount_and_free_segment(segment_ids, grace)
        if ret != 0:
            return _error(500, f"Unmount and free failed, ret={ret}")
        return _ok()

    def handle_unmount_local_disk(self, body: bytes) -> Reply:
        data = self._object(body)
        grace = data.get("grace_period_seconds", 0)
        if (
            type(grace) is not int
            or grace < 0
            or grace > _MAX_UNMOUNT_LOCAL_DISK_GRACE_PERIOD_SECONDS
        ):
            return _error(
                400,
                "Invalid grace_period_seconds, must be a non-negative integer no greater "
                f"than {_MAX_UNMOUNT_LOCAL_DISK_GRACE_PERIOD_SECONDS}",
            )
        ret = self._store().unmount_local_disk_segment(grace)
        if ret != 0:
            return _error(500, f"Unmount local disk failed, ret={ret}")
        return _ok()

    def handle_mount_shm(self, body: bytes) -> Reply:
        data = self._object(body)
        path = _shm_name_to_path(data.get("name"))
        size = data.get("size")
        if not path or size is None:
            return _error(400, "Missing or invalid name or size")
        ret, ids, _ = _ret_of(
            self._store().mount_segment(
                path,
                size,
                data.get("offset", 0),
                data.get("protocol", self.config.protocol),
                data.get("location", ""),
            )
        )
        if ret != 0:
            return _error(500, f"Mount failed, ret={ret}")
        return _ok(segment_ids=ids)

    def handle_unmount_shm(self, body: bytes) -> Reply:
        request = self._unmount_request(body)
        if request is None:
            return _error(400, "Missing segment_ids")
        segment_ids, grace = request
        failed = []
        with self._state_lock:
            for sid in segment_ids:
                if self._store().unmount_segment([sid], grace) != 0:
                    failed.append(sid)
                    continue
                if sid in self.mounted_segment_ids:
                    self.mounted_segment_ids.remove(sid)
            if not self.mounted_segment_ids:
                self.current_mode = "prefill"
        if failed:
            return _error(500, "Unmount failed for one or more segments", failed_segment_ids=failed)
        return _ok()

    def handle_reconfigure(self, body: bytes) -> Reply:
        data = self._object(body)
        mode = str(data.get("mode", "")).lower()
        if mode == "decode":
            return self._to_decode(data)
        if mode == "prefill":
            with self._state_lock:
                if self.mounted_segment_ids:
                    ret = self._store().unmount_segment(self.mounted_segment_ids)
                    if ret != 0:
                        return _error(500, f"Unmount failed, ret={ret}")
                    self.mounted_segment_ids.clear()
                self.current_mode = "prefill"
                self.last_mount_info.clear()
            return _ok(mode=self.current_mode)
        return _error(400, "Invalid mode. Use 'decode' or 'prefill'")

    def _to_decode(self, data: dict[str, Any]) -> Reply:
        path, size = data.get("path"), data.get("size")
        offset = data.get("offset", 0)
        protocol = data.get("protocol", self.config.protocol)
        location = data.get("location", "")
        if not path or size is None:
            return _error(400, "Missing path or size for decode mode")
        with self._state_lock:
            # Mount the new segment first; retire the previous ones only
            # once it is up, so a failed remount keeps serving from them.
            previous = list(self.mounted_segment_ids)
            ret, ids, _ = _ret_of(
                self._store().mount_segment(path, size, offset, protocol, location)
            )
            if ret != 0:
                if previous:
                    return _error(
                        500,
                        f"Mount failed, ret={ret}; keeping previous decode segments",
                        mode=self.current_mode,
                    )
                self.current_mode = "prefill"
                self.mounted_segment_ids.clear()
                self.last_mount_info.clear()
                return _error(
                    500, f"Mount failed, ret={ret}; rolled back to prefill", mode="prefill"
                )
            failed = [sid for sid in previous if self._store().unmount_segment([sid]) != 0]
            self.mounted_segment_ids = ids + failed
            self.current_mode = "decode"
            self.last_mount_info = {
                "path": path,
                "offset": offset,
                "size": size,
                "protocol": protocol,
                "location": location,
            }
        return _ok(mode=self.current_mode, segment_ids=self.mounted_segment_ids)


def _handler_class(service: MooncakeStoreService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "mc_store_rest_server"
        # Requests too malformed to route get a status line and a JSON body.
        default_request_version = "HTTP/1.1"
        error_content_type = "application/json"
        error_message_format = '{"error": "%(code)d: %(message)s"}'

        def _serve(self) -> None:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self.close_connection = True
                self._send(_error(411, "Content-Length required"))
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                self._send(_error(400, "Malformed Content-Length"))
                return
            if length > MAX_BODY:
                self.close_connection = True
                self._send(_error(413, f"Request body larger than {MAX_BODY} bytes"))
                return
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                self.close_connection = True
                return
            self._send(service.dispatch(self.command, self.path, body))

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _serve

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s - %s", self.address_string(), format % args)

    return Handler


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """Upstream's flags: ``--config``, ``-D/--define key=value``, ``--port``
    (8080), ``--max-wait-time`` (60 s)."""
    parser = ArgumentParser(
        prog="mc_store_rest_server", description="Mooncake Store Service with REST API"
    )
    parser.add_argument("--config", type=str, help="Path to Mooncake config file", required=False)
    parser.add_argument(
        "-D",
        "--define",
        action="append",
        help="Override configuration with key=value pairs (e.g., -Dlocal_hostname=example.com)",
        default=[],
    )
    parser.add_argument(
        "--port", type=port, help="HTTP API port (default: 8080)", default=8080, required=False
    )
    parser.add_argument(
        "--max-wait-time",
        type=float,
        help="Maximum total wait time in seconds (default: 60)",
        default=60,
        required=False,
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM (exit 0). Exit 1 when the config cannot
    be loaded, the port cannot be bound, or the store is not up in time."""
    args = parse_arguments(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s"
    )
    cli_config = {}
    for item in args.define:
        if "=" in item:
            key, value = item.split("=", 1)
            cli_config[key] = value
        else:
            log.warning("Ignoring invalid CLI config: %s", item)
    try:
        service = MooncakeStoreService(args.config, cli_config)
    except (OSError, ValueError, TypeError) as e:
        log.error("Configuration load failed: %s", e)
        return 1
    try:
        httpd = ThreadingHTTPServer(("0.0.0.0", args.port), _handler_class(service))
    except OSError as e:
        log.error("cannot listen on 0.0.0.0:%s: %s", args.port, e)
        return 1
    httpd.daemon_threads = True
    shutdown = threading.Event()

    def request_shutdown(signum: int, _frame: Any) -> None:
        log.info("Received signal %s, shutting down", signum)
        shutdown.set()

    signal.signal(signal.SIGINT, request_shutdown)
    signal.signal(signal.SIGTERM, request_shutdown)
    serving = None
    try:
        if not service.start_store_service(args.max_wait_time, shutdown):
            if shutdown.is_set():
                return 0
            log.error("Failed to start store service")
            return 1
        serving = threading.Thread(target=httpd.serve_forever, daemon=True)
        serving.start()
        log.info("REST API started on port %s", args.port)
        log.info("Mooncake Store Service is running")
        while not shutdown.wait(1.0):
            pass
        return 0
    finally:
        if serving is not None:
            httpd.shutdown()
        httpd.server_close()
        service.stop()


def sync_main() -> int:
    """Entry point of the ``mc_store_rest_server`` command."""
    return main()


if __name__ == "__main__":
    sys.exit(sync_main())
