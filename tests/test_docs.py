"""The docs against the code: one metrics table and one settings table, both in
docs/service.md, each matching what the app registers and reads; the README links to them
instead of copying them; every relative link in the docs leads somewhere.

(The settings table itself is checked against `Settings` in tests/serving/test_settings.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.serving.metrics import Metrics
from service.serving.settings import Settings
from tests.conftest import ROOT

SERVICE_DOC = ROOT / "docs" / "service.md"
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# NMT_* variables the README may name that are not service settings: the training data folder
# (`nmt train`) and the compose file's CPU count.
NOT_SETTINGS = {"NMT_DATA_DIR", "NMT_CPUS"}
# Python modules whose names start like a metric.
NOT_METRICS = {"nmt_contract", "nmt_cli"}
# Sample suffixes Prometheus adds to a histogram's family name.
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## ` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def documented_metrics() -> dict[str, tuple[str, set[str]]]:
    """metric name -> (type, label names), from the Metrics table of docs/service.md."""
    table = section(SERVICE_DOC.read_text(), "Metrics")
    rows = re.findall(r"^\| `(nmt_[a-z_]+)` \|([^|]+)\|([^|]*)\|", table, flags=re.MULTILINE)
    return {
        name: (kind.strip(), {label.strip() for label in labels.split(",") if label.strip()})
        for name, kind, labels in rows
    }


def registered_metrics() -> dict[str, tuple[str, set[str]]]:
    """metric name as scraped -> (type, label names), from the registry the app uses.

    Counters are scraped (and documented) with `_total`, info metrics with `_info` as the
    gauge of value 1 that Prometheus sees."""
    metrics = Metrics()
    labels = {
        wrapper._name: set(wrapper._labelnames)  # prometheus_client keeps no public accessor
        for wrapper in vars(metrics).values()
        if hasattr(wrapper, "_labelnames") and hasattr(wrapper, "_name")
    }
    found = {}
    for family in metrics.registry.collect():
        if family.type == "counter":
            found[f"{family.name}_total"] = ("counter", labels[family.name])
        elif family.type == "info":
            (sample,) = family.samples
            found[f"{family.name}_info"] = ("gauge (1)", set(sample.labels))
        else:
            found[family.name] = (family.type, labels[family.name])
    return found


def test_the_metrics_table_lists_every_registered_metric_and_nothing_else():
    documented, registered = documented_metrics(), registered_metrics()
    assert registered, "no metrics registered: the test would prove nothing"
    missing = sorted(set(registered) - set(documented))
    assert not missing, f"registered but not in docs/service.md's Metrics table: {missing}"
    stale = sorted(set(documented) - set(registered))
    assert not stale, f"in docs/service.md's Metrics table but not registered: {stale}"
    for name, (kind, labels) in registered.items():
        assert documented[name] == (kind, labels), name


def test_metric_names_in_the_docs_are_registered():
    """A metric renamed or removed leaves no stale name in prose, dashboards' docs or alerts'
    runbooks."""
    samples = set()
    for name, (kind, _) in registered_metrics().items():
        samples.add(name)
        if kind == "histogram":
            samples.update(name + suffix for suffix in HISTOGRAM_SAMPLES)
    for page in PAGES:
        # A name ending in `_*` or `*_` is a family of names, not one.
        names = set(re.findall(r"\bnmt_[a-z_]*[a-z](?![a-z_*])", page.read_text()))
        unknown = sorted(names - samples - NOT_METRICS)
        assert not unknown, f"{page.relative_to(ROOT)} names unregistered metrics: {unknown}"


def test_the_readme_links_to_the_settings_table_instead_of_copying_it():
    text = README.read_text()
    copied = re.findall(r"^\| `(NMT_[A-Z0-9_]+)` \|", text, flags=re.MULTILINE)
    assert not copied, f"the README has a settings table again ({copied[:3]} ...): one place"
    assert "(docs/service.md#settings)" in text
    settings = {f"NMT_{name.upper()}" for name in Settings.model_fields}
    named = set(re.findall(r"\bNMT_[A-Z0-9_]*[A-Z0-9]\b", text))
    unknown = sorted(named - settings - NOT_SETTINGS)
    assert not unknown, f"the README names settings that do not exist: {unknown}"


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub makes for a page's headings: lowercase, punctuation removed, spaces
    to '-', a repeated heading numbered."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_to_a_file_and_a_heading(page: Path):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
