"""The benchmarks' one harness for servers: a bundle to serve, a free loopback port, an
`nmt serve` process started with NMT_* settings, watched through /proc (RSS, open file
descriptors) and its JSON log, and stopped with SIGTERM.

Every benchmark that starts a server starts it here, so that they all measure the same thing:
the product as `nmt serve` runs it, from a checkout (`tree`: this one, or another commit's
worktree to measure before and after a change side by side). The load they play and the
reports they write are bench.load's and bench.report's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from nmt_contract import BUNDLE_FORMAT
from service.runtime.search import SearchOptions
from service.serving.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = ROOT / "build" / "models"
CHECKPOINT = ROOT / "models" / "fr-en"
# `-m nmt_cli` rather than the `nmt` script: it runs the code of the checkout it starts in.
SERVE = [sys.executable, "-m", "nmt_cli", "serve"]
READY_TIMEOUT_SECONDS = 180.0


def served_options(beam_size: int) -> SearchOptions:
    """A search as the server runs it by default (length penalty, repetition guard), without
    reading the environment: what benchmarks translate with to time or judge the product."""
    return Settings.model_construct().default_search(beam_size)


def ensure_bundle(bundles: Path = BUNDLES) -> Path:
    """The folder of bundles to serve: the committed checkpoint, exported once (with int8)."""
    bundle = bundles / "fr-en"
    manifest = bundle / "bundle.json"
    if not manifest.is_file() or json.loads(manifest.read_text()).get("format") != BUNDLE_FORMAT:
        export = ["-m", "nmt_cli", "export", "--checkpoint", str(CHECKPOINT), "--out", str(bundle)]
        subprocess.run([sys.executable, *export, "--int8"], cwd=ROOT, check=True)
    return bundles


def temporary_bundles(stack: ExitStack) -> Path:
    """The committed checkpoint exported (fp32 only) to a folder of bundles that lives as long
    as `stack`: what a benchmark serves when it is not given a --model-dir."""
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-")))
    print("exporting models/fr-en to a temporary bundle…", file=sys.stderr)
    export = ["-m", "nmt_cli", "export", "--checkpoint", str(CHECKPOINT)]
    subprocess.run(
        [sys.executable, *export, "--out", str(folder / "fr-en")],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return folder


def free_port() -> int:
    """A loopback port nobody listens on now (the kernel's pick), for a server or a proxy."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log_path: Path
    settings: dict[str, str]  # the NMT_* variables it was started with, beyond the defaults

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for(
        self, path: str = "/readyz", timeout: float = READY_TIMEOUT_SECONDS, every: float = 0.2
    ) -> float:
        """Seconds until `path` answers 200, polled `every` seconds; raises if the process
        exits first or `timeout` passes (its log says why)."""
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.process.returncode} before {path} answered 200; "
                    f"log: {self.log_path}"
                )
            if time.monotonic() - started > timeout:
                raise RuntimeError(
                    f"{self.url}{path} not 200 within {timeout:.0f} s: {self.log_path}"
                )
            try:
                if httpx.get(f"{self.url}{path}", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(every)

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

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, as an orchestrator sends it (unless it already exited), and its exit code:
        0 when it drained, None when it had to be killed after `timeout` seconds."""
        if self.process.poll() is None:
            self.signal_terminate()
        return self.wait_exit(timeout)


def start_server(
    model_dir: Path,
    log_dir: Path,
    tree: Path = ROOT,
    prefix: Sequence[str] = (),
    **settings: object,
) -> Server:
    """`nmt serve` on a free loopback port, started and not waited for (`wait_for` it).

    `settings` become NMT_* variables (`threads=1` is NMT_THREADS=1); `tree` is the checkout
    whose code serves; `prefix` a command to run it under (`taskset -c 0`, to split cores)."""
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
        process = subprocess.Popen(
            [*prefix, *SERVE], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    return Server(process, f"http://127.0.0.1:{port}", log_path, env_settings)


def described(told: list[str], tree: Path | None) -> str:
    """A server as a report names it: the NAME=VALUE settings it was told and its checkout."""
    return f"{' '.join(told) or 'defaults'}, {f'from {tree}' if tree else 'this checkout'}"


@contextmanager
def running_server(
    model_dir: Path, log_dir: Path, tree: Path = ROOT, **settings: object
) -> Iterator[Server]:
    """A started server (see start_server), yielded once /readyz says ready; stopped with
    SIGTERM at the end (unless the caller already stopped it)."""
    server = start_server(model_dir, log_dir, tree, **settings)
    try:
        server.wait_for("/readyz")
        yield server
    finally:
        server.stop()
