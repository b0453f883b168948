"""The image, built and run with podman (deploy/container-test.sh: no Docker engine and no
registry here; the script makes its own Debian base once and reuses it).

One build per session; each test talks to a container as an orchestrator would: through the
published port, the image's health check, `podman exec` and `podman stop` (SIGTERM).
Slow (minutes on the first build); skipped, naming what is missing, without podman as root.
NMT_TEST_IMAGE=IMAGE tests that image instead of building one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import FRENCH_SENTENCES, ROOT
from tests.servers import free_port, wait_until

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "deploy" / "container-test.sh"
BUNDLE_IN_IMAGE = "/opt/nmt/models/fr-en"
PODMAN_ENV = {
    **os.environ,
    "CONTAINERS_CONF": os.environ.get(
        "CONTAINERS_CONF", str(ROOT / "deploy" / "podman" / "containers.conf")
    ),
}


def podman(*args: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, check=check, **kwargs
    )


@pytest.fixture(scope="session")
def image(pytestconfig: pytest.Config) -> str:
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install podman runc debootstrap)")
    if os.geteuid() != 0:
        pytest.skip("the podman set-up of deploy/container-test.sh runs as root")
    if prebuilt := os.environ.get("NMT_TEST_IMAGE"):
        return prebuilt  # an image built before (by the script, or elsewhere), tested as it is
    log = ROOT / "reports" / "container-build.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as stderr:
        result = subprocess.run(
            [str(SCRIPT), "build"],
            env=PODMAN_ENV,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=1800,
            check=False,
        )
    if result.returncode != 0:
        pytest.fail(f"image build failed; the end of {log}:\n{log.read_text()[-4000:]}")
    build = json.loads(result.stdout.strip().splitlines()[-1])
    (log.parent / "container-build.json").write_text(json.dumps(build, indent=2) + "\n")
    # Shown in the test output whatever the capture setting: the numbers docs/deploy.md quotes.
    line = (
        f"image {build['image']}: built in {build['build_seconds']} s, "
        f"{build['size_bytes'] / 1e6:.0f} MB, {build['debian_packages']} Debian packages, "
        f"{len(build['python_packages'])} Python distributions"
    )
    plugins = pytestconfig.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n{line}")
    return build["image"]


class Container:
    """A detached container from the image, with a read-only root and its port published."""

    def __init__(self, image: str, env: dict[str, str] | None = None) -> None:
        self.name = f"nmt-test-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        options = [f"--env={key}={value}" for key, value in (env or {}).items()]
        # The image's health check, run on demand below: no systemd here to schedule it.
        podman(
            "run", "--detach", "--name", self.name, "--read-only", "--health-interval=disable",
            "--publish", f"127.0.0.1:{self.port}:8000", *options, image,
        )  # fmt: skip

    def running(self) -> bool:
        return (
            podman("inspect", "--format", "{{.State.Running}}", self.name).stdout.strip() == "true"
        )

    def wait_healthy(self, timeout: float = 180) -> None:
        def healthy() -> bool:
            if not self.running():
                logs = podman("logs", self.name, check=False).stderr[-3000:]
                pytest.fail(f"container {self.name} exited while starting:\n{logs}")
            # Runs the image's own HEALTHCHECK command inside the container.
            return podman("healthcheck", "run", self.name, check=False).returncode == 0

        wait_until(healthy, timeout, f"health check of {self.name}")

    def remove(self) -> None:
        # --volumes: the anonymous volume of the image's VOLUME (NMT_STATE_DIR) goes too.
        podman("rm", "--force", "--volumes", "--time", "0", self.name, check=False)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[Container]:
    started = Container(image)
    try:
        started.wait_healthy()
        yield started
    finally:
        started.remove()


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        assert response.status == 200
        return json.loads(response.read())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_translates_as_nmt_translate_does_on_the_same_bundle(
    image: str, container: Container, beam_size: int
) -> None:
    sentences = FRENCH_SENTENCES[:6]
    body = {"text": sentences, "source_lang": "fr", "target_lang": "en", "beam_size": beam_size}
    served = [t["text"] for t in post_json(f"{container.url}/v1/translate", body)["translations"]]
    cli = podman(
        "run", "--rm", "--interactive", "--no-healthcheck", image,
        "translate", "--model-dir", BUNDLE_IN_IMAGE, "--beam-size", str(beam_size),
        input="\n".join(sentences) + "\n",
    )  # fmt: skip
    assert served == cli.stdout.splitlines()
    assert all(served)


def metric_value(metrics: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    total = 0.0
    for line in metrics.splitlines():
        match = re.match(rf"{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match and all(
            f'{key}="{value}"' in (match.group(1) or "") for key, value in labels.items()
        ):
            total += float(match.group(2))
    return total


def test_metrics_count_the_requests(container: Container) -> None:
    body = {"text": "Le chat dort.", "source_lang": "fr", "target_lang": "en"}
    post_json(f"{container.url}/v1/translate", body)
    metrics = get_text(f"{container.url}/metrics")
    assert metric_value(metrics, "nmt_requests_total", route="/v1/translate", status="200") >= 1
    assert metric_value(metrics, "nmt_model_load_seconds", model="fr-en") > 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert metric_value(metrics, "nmt_build_info", version=version) == 1


def test_runs_as_a_non_root_user_without_torch_or_benchmarks(
    image: str, container: Container
) -> None:
    assert podman("exec", container.name, "id", "-u").stdout.strip() == "10001"
    # No torch, and nothing outside the product: the benchmarks and tests never enter the image.
    for module in ("torch", "transformers", "bench", "tests"):
        result = podman("exec", container.name, "python3", "-c", f"import {module}", check=False)
        assert result.returncode != 0
        assert f"No module named '{module}'" in result.stderr
    # No compilers and no pip: the runtime stage copies a finished virtualenv.
    tools = podman("exec", container.name, "sh", "-c", "command -v gcc cc pip pip3", check=False)
    assert tools.stdout.strip() == ""

    inspect = json.loads(podman("image", "inspect", image).stdout)[0]
    config = inspect["Config"]
    assert config["User"] == "10001:10001"
    assert "8000/tcp" in config["ExposedPorts"]
    assert "/readyz" in " ".join(inspect["Healthcheck"]["Test"])
    labels = config["Labels"]
    for key in ("version", "revision", "source"):
        assert f"org.opencontainers.image.{key}" in labels
    assert labels["org.opencontainers.image.version"] != "dev"


def test_sigterm_during_a_request_answers_it_and_exits_zero(image: str) -> None:
    # A request that takes seconds: 200 distinct sentences at beam 8, no translation cache, and
    # deadlines that let it finish.
    patient = {
        "NMT_REQUEST_TIMEOUT_SECONDS": "300",
        "NMT_SHUTDOWN_TIMEOUT_SECONDS": "300",
        "NMT_CACHE_ENTRIES": "0",
    }
    container = Container(image, env=patient)
    try:
        container.wait_healthy()
        sentences = [
            f"Photo {n} : {FRENCH_SENTENCES[n % len(FRENCH_SENTENCES)]}" for n in range(200)
        ]
        texts = [" ".join(sentences[i : i + 5]) for i in range(0, 200, 5)]
        body = {"text": texts, "source_lang": "fr", "target_lang": "en", "beam_size": 8}
        answer: dict[str, Any] = {}

        def client() -> None:
            try:
                answer["body"] = post_json(f"{container.url}/v1/translate", body, timeout=600)
            except Exception as error:  # reported by the assertions below
                answer["error"] = error
            answer["at"] = time.monotonic()

        thread = threading.Thread(target=client)
        thread.start()
        # In flight: the gauge counts it and the /metrics request reading it.
        wait_until(
            lambda: (
                metric_value(get_text(f"{container.url}/metrics"), "nmt_requests_in_progress") >= 2
                or "at" in answer
            ),
            60,
            "the long request in flight",
            every=0.05,
        )
        assert "at" not in answer, "the request finished before SIGTERM could be sent"
        stopped_at = time.monotonic()
        podman("stop", "--time", "600", container.name, timeout=660)
        thread.join(60)
        print(f"answered {answer['at'] - stopped_at:.1f} s after SIGTERM")

        assert "error" not in answer, answer.get("error")
        assert answer["at"] > stopped_at  # answered after SIGTERM, not before it
        assert len(answer["body"]["translations"]) == len(texts)
        exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", container.name).stdout
        assert exit_code.strip() == "0"
    finally:
        container.remove()
