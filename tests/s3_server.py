"""An S3 API server on 127.0.0.1 for the tests: moto in server mode (its ThreadedMotoServer), as
Ray's own test suite uses for S3, started and stopped by the tests.

Ray's workers, pyarrow and the `ray-ormas` commands find it as they find any S3-compatible store:
through the environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_REGION`), which conftest.py sets before the session's Ray cluster starts so that every
worker inherits it. The buckets live in this test process: a server stopped and started again on
the same port serves the same objects, which is a storage outage and its end. The port is a small
TCP relay in front of moto, so that an outage also cuts the connections already open.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.request
import uuid


def s3_environment(port: int) -> dict[str, str]:
    """What a user of an S3-compatible store at 127.0.0.1:`port` puts in the environment."""
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "ray-ormas-tests",
        "AWS_SECRET_ACCESS_KEY": "ray-ormas-tests-secret",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


class S3Server:
    """moto's S3 API, reached on 127.0.0.1:`port` through a TCP relay this object controls.
    `stop()` is an outage: the port stops taking connections and every open connection is cut
    (moto's own server would keep serving its keep-alive connections); `start()` ends it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self._moto = None
        self._relay: _Relay | None = None

    def start(self, timeout_s: float = 30) -> S3Server:
        if self._moto is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            backend = free_port()
            while backend == self.port:
                backend = free_port()
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=backend, verbose=False)
            self._moto.start()
            self._backend = backend
        if self._relay is None:
            self._relay = _Relay(self.port, self._backend)
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if time.monotonic() > deadline:
                self.shutdown()
                raise RuntimeError(f"the S3 server on {self.endpoint} did not start")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        """Take the endpoint away (the objects stay, for `start()`)."""
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    def shutdown(self) -> None:
        """Stop the endpoint and moto itself (the end of the test session)."""
        self.stop()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None

    @property
    def running(self) -> bool:
        return self._relay is not None

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def bucket(self, prefix: str = "runs") -> str:
        """A new, empty bucket; its `s3://` URI."""
        import boto3

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return f"s3://{name}"


class _Relay:
    """Accepts on 127.0.0.1:`port` and pipes each connection to 127.0.0.1:`backend`, until closed."""

    def __init__(self, port: int, backend: int) -> None:
        self._backend = backend
        self._listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="s3-relay").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self._backend))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._open = self._open, set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread
        except OSError:
            pass
        self._listener.close()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_port() -> int:
    """A free port that nothing else will take before the server binds it, minutes later: below
    Linux's ephemeral range (32768 and up: every outgoing connection's local port) and above the
    ports Ray gives its workers (10002-19999). A port from `free_port()` was once taken by a Ray
    worker's connection in between ("Address already in use")."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()
