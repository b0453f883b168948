"""One `nmt serve` process per measurement: started on a free loopback port, watched through
/proc (RSS, open file descriptors) and its JSON log, stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from nmt_contract import BUNDLE_FORMAT

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = ROOT / "build" / "models"
CHECKPOINT = ROOT / "models" / "fr-en"
SERVE = [sys.executable, "-m", "nmt_cli", "serve"]
READY_TIMEOUT_SECONDS = 120.0


def ensure_bundle(bundles: Path = BUNDLES) -> Path:
    """The folder of bundles to serve: the committed checkpoint, exported once (with int8)."""
    bundle = bundles / "fr-en"
    manifest = bundle / "bundle.json"
    if not manifest.is_file() or json.loads(manifest.read_text()).get("format") != BUNDLE_FORMAT:
        export = ["-m", "nmt_cli", "export", "--checkpoint", str(CHECKPOINT), "--out", str(bundle)]
        subprocess.run([sys.executable, *export, "--int8"], cwd=ROOT, check=True)
    return bundles


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log_path: Path
    settings: dict[str, str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines (anything else, such as a crash's raw traceback, is skipped)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def access_log(self) -> dict[str, dict[str, Any]]:
        """The access log line of each request id (the last one, should there be two)."""
        return {
            str(r.get("request_id")): r
            for r in self.log_records()
            if r.get("logger") == "nmt.access"
        }

    def access_log_ids(self) -> Counter[str]:
        """How many access log lines each request id has: every request that reached the app
        has exactly one, whatever its status (499 when no answer was sent)."""
        return Counter(
            str(r.get("request_id")) for r in self.log_records() if r.get("logger") == "nmt.access"
        )

    def error_lines(self, limit: int = 5) -> list[str]:
        """The first error log lines, with the last line of any traceback: the findings."""
        lines = []
        for record in self.log_records():
            if record.get("level") in ("error", "critical"):
                exception = str(record.get("exception", "")).strip().splitlines()
                tail = f" [{exception[-1]}]" if exception else ""
                lines.append(f"{record.get('logger')}: {record.get('message')}{tail}")
        return lines[:limit]

    def rss_bytes(self) -> int:
        return self._status_bytes("VmRSS")

    def peak_rss_bytes(self) -> int:
        """The most resident memory the process has had (the kernel's high-water mark)."""
        return self._status_bytes("VmHWM")

    def _status_bytes(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc status")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def signal_terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None when the process had to be killed (it hung)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None


@contextmanager
def running_server(
    model_dir: Path, log_dir: Path, tree: Path = ROOT, **settings: object
) -> Iterator[Server]:
    """`nmt serve` with NMT_* settings, yielded once /readyz says ready; SIGTERM at the end
    (unless the caller already stopped it). `tree`: the checkout whose code serves (another
    commit's worktree, to measure before and after a change side by side)."""
    port = free_port()
    env_settings = {f"NMT_{name.upper()}": str(value) for name, value in settings.items()}
    env = {
        **os.environ,
        "NMT_MODEL_DIR": str(model_dir),
        "NMT_HOST": "127.0.0.1",
        "NMT_PORT": str(port),
        **env_settings,
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(SERVE, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log_path, env_settings)
    try:
        _wait_ready(server)
        yield server
    finally:
        if process.poll() is None:
            server.signal_terminate()
            server.wait_exit(timeout=60)


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early; log: {server.log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not ready in {READY_TIMEOUT_SECONDS} s: {server.log_path}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
