"""A fault-injecting HTTP proxy in front of the moto S3 server, and the fixtures that use it.

The proxy forwards every request unchanged to moto until a test switches a rule on (thread-safe,
at any moment, also while a save is running):

- `deny_deletes()`: 403 AccessDenied to `DELETE` of an object and to `POST ?delete` (a write-once bucket);
- `unavailable(method=None, suffix="", code="SlowDown")`: 503 to every request, to every request of
  one method (e.g. "PUT"), or only to those whose key ends with `suffix` (e.g. "manifest.json");
- `reset_once(suffix)`: the first PUT whose key ends with `suffix` has its connection reset (closed
  without an answer); the retry and everything after pass through;
- `drop_mid_upload(suffix="")`: every matching PUT has part of its body read, then its connection
  reset (the connection lost mid-upload);
- `reset()`: back to forwarding everything (the counts are kept unless asked).

Every request is recorded (method, key, query, what the proxy did, the status answered), and
`count(...)` answers how many requests matched, e.g. `proxy.count("PUT", suffix=".tensors")`.
Only the standard library: `ThreadingHTTPServer` + `http.client`, on 127.0.0.1, port from the OS.

Fixtures (import `s3_proxy_fixture, proxied_bucket_fixture` into a test module to use them): `s3_proxy`,
a fresh proxy per test in front of conftest's `s3_server`; `proxied_bucket`, a fresh bucket with
storage options through that proxy.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

__all__ = ["S3Proxy", "Request", "ProxiedBucket", "s3_proxy_fixture", "proxied_bucket_fixture", "storage_options_for",
           "FORWARDED", "DENIED", "UNAVAILABLE", "RESET", "DROPPED"]

FORWARDED, DENIED, UNAVAILABLE, RESET, DROPPED = "forwarded", "denied", "unavailable", "reset", "dropped"
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "expect", "proxy-connection"}
_MESSAGES = {"SlowDown": "Please reduce your request rate.", "ServiceUnavailable": "Service is unable to handle "
             "request.", "AccessDenied": "Access Denied"}


@dataclass(frozen=True)
class Request:
    """One request the proxy received, and what it did with it.

    Attributes:
        method: The HTTP method.
        bucket: The bucket ("" for the service).
        key: The object key ("" for a bucket-level request).
        query: The names of the query parameters (e.g. {"delete"}, {"list-type", "prefix", ...}).
        outcome: "forwarded", "denied" (403), "unavailable" (503), "reset" or "dropped" (mid-upload).
        status: The status answered (0 when the connection was closed without an answer).
    """

    method: str
    bucket: str
    key: str
    query: frozenset[str]
    outcome: str
    status: int


@dataclass
class _Rules:
    deny_deletes: bool = False
    unavailable: tuple[str | None, str, str] | None = None  # (method or None, key suffix, error code)
    reset_once: str | None = None  # key suffix of the PUT whose connection is reset once
    drop_mid_upload: str | None = None  # key suffix of the PUTs cut off mid-body
    after_put: tuple[str, tuple[str | None, str, str]] | None = None  # (key suffix, the `unavailable` rule then)


class S3Proxy:
    """A proxy on 127.0.0.1 (port from the OS) forwarding to `upstream`, with switchable faults.

    Args:
        upstream: The S3 server's URL, e.g. "http://127.0.0.1:5123".
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self._lock = threading.Lock()
        self._rules = _Rules()
        self._requests: list[Request] = []
        self._changed = threading.Condition(self._lock)
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._connections: set[socket.socket] = set()  # the clients' open connections, closed by stop()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="s3-proxy", daemon=True)

    def start(self) -> S3Proxy:
        """Start serving (in a daemon thread)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and every client connection still open (a client's
        pooled connection must not reach this proxy's handlers, and its rules, after it stopped)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    # ----- rules ----------------------------------------------------------------------------

    def deny_deletes(self, on: bool = True) -> None:
        """Answer 403 AccessDenied to every object DELETE and every bulk delete (POST ?delete)."""
        with self._lock:
            self._rules.deny_deletes = on

    def unavailable(self, method: str | None = None, suffix: str = "", code: str = "SlowDown") -> None:
        """Answer 503 with the S3 error `code` to every request (method None) or every `method` request,
        whose key ends with `suffix` ("" matches every key)."""
        with self._lock:
            self._rules.unavailable = (method.upper() if method else None, suffix, code)

    def reset_once(self, suffix: str) -> None:
        """Reset the connection of the next PUT whose key ends with `suffix` (once), without answering."""
        with self._lock:
            self._rules.reset_once = suffix

    def drop_mid_upload(self, suffix: str = "") -> None:
        """For every PUT whose key ends with `suffix`: read part of its body, then reset the connection."""
        with self._lock:
            self._rules.drop_mid_upload = suffix

    def unavailable_after_put(self, trigger: str, method: str | None = None, code: str = "ServiceUnavailable") -> None:
        """Once a PUT whose key ends with `trigger` has gone through, answer 503 to every `method` request (None:
        every request): storage that goes away right after a commit."""
        with self._lock:
            self._rules.after_put = (trigger, (method.upper() if method else None, "", code))

    def reset(self, counts: bool = False) -> None:
        """Forward everything unchanged again; with `counts`, also forget the requests recorded."""
        with self._lock:
            self._rules = _Rules()
            if counts:
                self._requests.clear()

    # ----- what happened ----------------------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """Every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def count(self, method: str | None = None, suffix: str = "", outcome: str | None = None,
              query: str | None = None) -> int:
        """How many requests had this method (None: any), a key ending with `suffix`, this outcome (None:
        any) and this query parameter (None: any)."""
        return len(self.matching(method, suffix, outcome, query))

    def matching(self, method: str | None = None, suffix: str = "", outcome: str | None = None,
                 query: str | None = None) -> list[Request]:
        """The requests `count` counts."""
        return [r for r in self.requests if (method is None or r.method == method.upper()) and r.key.endswith(suffix)
                and (outcome is None or r.outcome == outcome) and (query is None or query in r.query)]

    def wait_for(self, condition: Callable[[S3Proxy], bool], timeout: float = 60.0) -> None:
        """Wait until `condition(self)` is true (checked at each request); TimeoutError after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not condition(self):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the proxy did not see the awaited requests within {timeout} s")
            with self._changed:
                self._changed.wait(min(left, 0.2))

    # ----- the handler's side -----------------------------------------------------------------

    def _decide(self, method: str, key: str, query: frozenset[str]) -> tuple[str, str]:
        """(outcome, error code) for a request, consuming a once-rule when it applies."""
        with self._lock:
            rules = self._rules
            is_delete = (method == "DELETE" and bool(key)) or (method == "POST" and "delete" in query)
            if rules.deny_deletes and is_delete:
                return DENIED, "AccessDenied"
            if rules.unavailable is not None:
                only, suffix, code = rules.unavailable
                if (only is None or only == method) and key.endswith(suffix):
                    return UNAVAILABLE, code
            if method == "PUT" and key:
                if rules.reset_once is not None and key.endswith(rules.reset_once):
                    rules.reset_once = None
                    return RESET, ""
                if rules.drop_mid_upload is not None and key.endswith(rules.drop_mid_upload):
                    return DROPPED, ""
                if rules.after_put is not None and key.endswith(rules.after_put[0]):
                    rules.unavailable, rules.after_put = rules.after_put[1], None
            return FORWARDED, ""

    def _record(self, request: Request) -> None:
        with self._changed:
            self._requests.append(request)
            self._changed.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
    owner: S3Proxy

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass

    def handle(self) -> None:
        with self.owner._lock:
            self.owner._connections.add(self.connection)
        try:
            super().handle()
        except OSError:
            pass  # the client went away, or we reset the connection on purpose
        finally:
            with self.owner._lock:
                self.owner._connections.discard(self.connection)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET  # noqa: N815

    def _proxy(self) -> None:
        parts = urlsplit(self.path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        query = frozenset(parse_qs(parts.query, keep_blank_values=True))
        method = self.command
        outcome, code = self.owner._decide(method, key, query)
        if outcome == RESET:
            self.owner._record(Request(method, bucket, key, query, outcome, 0))
            self._reset_connection()
            return
        if outcome == DROPPED:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(max(1, length // 2) if length else 0)
            self.owner._record(Request(method, bucket, key, query, outcome, 0))
            self._reset_connection()
            return
        body = self._read_body()
        if outcome in (DENIED, UNAVAILABLE):
            status = 403 if outcome == DENIED else 503
            self._answer_error(status, code, parts.path)
            self.owner._record(Request(method, bucket, key, query, outcome, status))
            return
        status = self._forward(body)
        self.owner._record(Request(method, bucket, key, query, outcome, status))

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, body: bytes) -> int:
        owner = self.owner
        connection = http.client.HTTPConnection(owner.upstream_host, owner.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            data = response.read()
            self.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_BY_HOP and not (name.lower() == "content-length"
                                                            and self.command != "HEAD"):
                    self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD" and data:
                self.wfile.write(data)
            return response.status
        finally:
            connection.close()

    def _answer_error(self, status: int, code: str, resource: str) -> None:
        request_id = uuid.uuid4().hex[:16].upper()
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{_MESSAGES.get(code, code)}</Message><Resource>{resource}</Resource>"
                f"<RequestId>{request_id}</RequestId></Error>").encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        if self.command == "HEAD":
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reset_connection(self) -> None:
        """Close the socket at once with a TCP reset (SO_LINGER 0), answering nothing."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.rfile.close()  # the socket closes for real only when its file objects are closed too
        self.connection.close()


# ----- fixtures ---------------------------------------------------------------------------------


def storage_options_for(endpoint: str, *, bounded: bool = True) -> dict[str, Any]:
    """s3fs options for `endpoint`; `bounded`: botocore makes 2 attempts per call (`total_max_attempts`;
    its `max_attempts` counts the retries only), with 5 s / 10 s connect / read timeouts.

    (s3fs's own retry loop, 5 tries for a connection error or a SlowDown answer, is a class attribute
    that storage options cannot change: a "retries" option is handed to aiobotocore's session and
    fails every call with a TypeError.)
    """
    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}, "key": "testing", "secret": "testing"}
    if bounded:
        options["config_kwargs"] = {"retries": {"total_max_attempts": 2, "mode": "standard"}, "connect_timeout": 5,
                                    "read_timeout": 10}
    return options


@pytest.fixture(name="s3_proxy")
def s3_proxy_fixture(s3_server) -> Iterator[S3Proxy]:
    """A fresh fault-injecting proxy in front of the session's moto server, forwarding everything."""
    proxy = S3Proxy(s3_server).start()
    yield proxy
    proxy.stop()


class ProxiedBucket(NamedTuple):
    """A fresh bucket: its URL, s3fs options through the proxy (bounded retries), and options straight to moto."""

    url: str
    storage_options: dict[str, Any]
    direct_options: dict[str, Any]


@pytest.fixture(name="proxied_bucket")
def proxied_bucket_fixture(s3_proxy, s3_server, request) -> Iterator[ProxiedBucket]:
    """A fresh bucket named after the test (unique per run), reached through `s3_proxy`."""
    import s3fs

    direct = storage_options_for(s3_server, bounded=False)
    fs = s3fs.S3FileSystem(**direct)
    label = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:32].strip("-")
    name = f"ktf-{label}-{uuid.uuid4().hex[:10]}"
    fs.mkdir(name)
    yield ProxiedBucket(f"s3://{name}", storage_options_for(s3_proxy.url), direct)
    fs.rm(name, recursive=True)  # straight to moto: the proxy may still be denying deletes
