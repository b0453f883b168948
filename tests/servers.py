"""The tests' one way to run a real server: a free loopback port, `nmt serve` with NMT_*
settings until /readyz answers, SIGTERM at the end; and the polling the live tests share.

Tests keep a harness of their own (bench/harness.py is the benchmarks'): the suite must not
depend on bench/, which is outside the product, and tests fail through pytest, not exceptions.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT

# `-m nmt_cli` rather than the `nmt` script: the code of this checkout, whatever is installed.
SERVE = [sys.executable, "-m", "nmt_cli", "serve"]


def free_port() -> int:
    """A loopback port nobody listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """Call `check` until it returns something truthy (an OSError counts as not yet: a server
    not listening); fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, as an orchestrator sends it; killed if it has not exited a minute later."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def running_server(model_dir: Path, log_dir: Path, **settings: object) -> Iterator[Server]:
    """`nmt serve` with NMT_* settings, once /readyz says ready; stopped (SIGTERM) at the end."""
    port = free_port()
    env = {
        **os.environ,
        "NMT_MODEL_DIR": str(model_dir),
        "NMT_HOST": "127.0.0.1",
        "NMT_PORT": str(port),
        **{f"NMT_{name.upper()}": str(value) for name, value in settings.items()},
    }
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(SERVE, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"server exited early:\n{server.log()}"
            assert time.monotonic() < deadline, f"server not ready in time:\n{server.log()}"
            try:
                if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield server
    finally:
        stop(process)
