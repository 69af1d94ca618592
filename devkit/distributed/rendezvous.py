"""The rendezvous store devkit-run serves to its ranks: a tiny TCP key-value store.

Ranks use it to pass small values to each other before they share a
communicator (rank 0's collective unique id). The launcher serves it on the
loopback interface, on an ephemeral port, and tells the ranks where in
``DEVKIT_RENDEZVOUS=host:port``.

The protocol is one request line and one answer line per connection, values
hex-encoded::

    PUT <key> <hex>            ->  OK
    GET <key> <timeout_s>      ->  VALUE <hex> | TIMEOUT | CLOSED

``GET`` blocks (on the server) until the key is put, the timeout passes or the
server closes. Keys are single words without whitespace.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time

from ..errors import DeadlineExceededError

RENDEZVOUS_ENV = "DEVKIT_RENDEZVOUS"
_MAX_LINE = 64 * 1024  # ample for hex of a 4096-byte unique id
_TIMED_OUT, _CLOSED = object(), object()


class _Store:
    def __init__(self):
        self.values: dict[str, bytes] = {}
        self.closed = False
        self.changed = threading.Condition()

    def put(self, key: str, value: bytes) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def get(self, key: str, timeout: float):
        """The value, or _TIMED_OUT, or _CLOSED when the server shuts down first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while key not in self.values:
                left = deadline - time.monotonic()
                if self.closed:
                    return _CLOSED
                if left <= 0:
                    return _TIMED_OUT
                self.changed.wait(left)
            return self.values[key]

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()


class _Handler(socketserver.StreamRequestHandler):
    def handle(self):
        words = self.rfile.readline(_MAX_LINE).decode("ascii", errors="replace").split()
        self.wfile.write(self._answer(words).encode("ascii") + b"\n")

    def _answer(self, words: list[str]) -> str:
        store: _Store = self.server.store
        try:
            if len(words) == 3 and words[0] == "PUT":
                store.put(words[1], bytes.fromhex(words[2]))
                return "OK"
            if len(words) == 3 and words[0] == "GET":
                value = store.get(words[1], float(words[2]))
                if value is _TIMED_OUT:
                    return "TIMEOUT"
                if value is _CLOSED:
                    return "CLOSED"
                return f"VALUE {value.hex()}"
        except ValueError as exc:  # bad hex or timeout
            return f"ERROR {exc}"
        return "ERROR expected 'PUT key hex' or 'GET key timeout'"


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class RendezvousServer:
    """Serves the store on 127.0.0.1 at an ephemeral port until ``close()``."""

    def __init__(self, host: str = "127.0.0.1"):
        self._server = _Server((host, 0), _Handler)
        self._server.store = _Store()
        self.address = f"{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="devkit-rendezvous",
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving, answer pending GETs with CLOSED and release the port."""
        self._server.store.close()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> RendezvousServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class RendezvousClient:
    """Talks to the store at ``address`` ("host:port", e.g. from DEVKIT_RENDEZVOUS)."""

    def __init__(self, address: str):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"rendezvous address {address!r} is not host:port")
        self.address = address
        self._endpoint = (host, int(port))

    def put(self, key: str, value: bytes) -> None:
        answer = self._request(f"PUT {_check_key(key)} {bytes(value).hex()}", timeout=30)
        if answer != "OK":
            raise RuntimeError(f"rendezvous {self.address} refused PUT {key}: {answer}")

    def get(self, key: str, timeout: float) -> bytes:
        """The value stored under ``key``, waiting up to ``timeout`` seconds for it to be put."""
        answer = self._request(f"GET {_check_key(key)} {float(timeout)}", timeout=timeout + 30)
        if answer.startswith("VALUE "):
            return bytes.fromhex(answer[len("VALUE "):])
        if answer == "TIMEOUT":
            raise DeadlineExceededError(
                f"rendezvous {self.address}: nobody put {key!r} within {timeout:g} s")
        if answer == "CLOSED":
            raise RuntimeError(f"rendezvous {self.address} closed while waiting for {key!r} "
                               f"(the launcher is shutting down)")
        raise RuntimeError(f"rendezvous {self.address} refused GET {key}: {answer}")

    def _request(self, line: str, timeout: float) -> str:
        try:
            with socket.create_connection(self._endpoint, timeout=timeout) as connection:
                connection.sendall(line.encode("ascii") + b"\n")
                with connection.makefile("rb") as answer:
                    return answer.readline(_MAX_LINE).decode("ascii").strip()
        except OSError as exc:
            raise ConnectionError(
                f"cannot reach the rendezvous store at {self.address} ({exc}); is the "
                f"devkit-run launcher that set {RENDEZVOUS_ENV} still running?") from exc


def _check_key(key: str) -> str:
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"rendezvous key {key!r} must be a non-empty word without whitespace")
    return key
