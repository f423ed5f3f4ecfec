"""A real `mlflow server` on 127.0.0.1 (SQLite backend, local artifact store) for the tests,
which can be killed and started again on the same port and store (an outage)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ray_ormas._internal.tracking.sqlite_seed import seed_new_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLflowServer:
    """`mlflow server` in its own process group; `kill()` SIGKILLs the group, `start()` starts it again."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        root.mkdir(parents=True, exist_ok=True)

    def start(self, timeout_s: float = 90) -> MLflowServer:
        # A new store starts as a copy of an empty one MLflow built once (what ray-ormas does for
        # a fit's own store), not as a schema migration: seconds of CPU per server.
        seed_new_store(f"sqlite:///{self.root / 'mlflow.db'}")
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.time() + timeout_s
        while not self.answers():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        return self

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server's process group (an outage: nothing is flushed or closed)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
            self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None


@contextmanager
def mlflow_server(root: Path, start_timeout_s: float = 90) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start a server; yield (uri, process); stop its process group at the end."""
    server = MLflowServer(root)
    try:
        server.start(start_timeout_s)
        yield server.uri, server.proc
    finally:
        server.stop()
