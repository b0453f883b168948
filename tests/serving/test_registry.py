"""The model repository and registry: versions chosen by policy, a load that switches only once
the new version is warm, a broken version refused while the old one serves, a rollback, and a
retired version kept open until the requests holding it are done."""

from __future__ import annotations

import gc
import shutil
import time
import weakref
from pathlib import Path

import pytest

from service.runtime.bundle import BundleError
from service.serving import registry as registry_module
from service.serving.errors import (
    ModelLoadFailed,
    ModelUnavailable,
    ModelUnknown,
    ModelVersionUnknown,
    UnknownPair,
)
from service.serving.metrics import Metrics
from service.serving.registry import ModelRegistry, RepositoryWatch
from service.serving.repository import ModelRepository, VersionPolicy
from service.serving.settings import Settings


def add_version(repository: Path, name: str, version: int | None, bundle: Path) -> Path:
    """A version folder whose files link to `bundle`'s (a real, checksummed bundle)."""
    folder = repository / name if version is None else repository / name / str(version)
    folder.mkdir(parents=True)
    for file in bundle.iterdir():
        (folder / file.name).symlink_to(file.resolve())
    return folder


def break_version(folder: Path) -> None:
    """A bundle whose decoder no longer matches its checksum (a half-copied file)."""
    decoder = folder / "decoder.onnx"
    data = decoder.read_bytes()
    decoder.unlink()
    decoder.write_bytes(data[: len(data) // 2])


def registry_of(repository: Path, **settings: object) -> ModelRegistry:
    options = {"warmup": False, "threads": 1, **settings}
    return ModelRegistry(Settings(model_dir=repository, **options), Metrics())  # type: ignore[arg-type]


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("text", "versions", "expected", "wanted"),
    [
        ("latest", [1, 3, 2], [3, 2, 1], 1),
        ("latest:2", [1, 3, 2], [3, 2, 1], 2),
        ("all", [2, 1], [2, 1], None),
        ("specific:1,3", [1, 2, 3], [3, 1], None),
    ],
)
def test_a_version_policy_orders_the_candidates_and_says_how_many_to_load(
    text, versions, expected, wanted
):
    policy = VersionPolicy.parse(text)
    assert policy.candidates(versions) == expected
    assert policy.wanted == wanted
    assert str(policy) == text


@pytest.mark.parametrize("text", ["newest", "latest:0", "specific:", "specific:a", ""])
def test_a_bad_version_policy_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(ValueError, match="latest, latest:N"):
        VersionPolicy.parse(text)
    with pytest.raises(ValueError, match="latest:N"):
        Settings(model_version_policy=text)


def test_the_repository_reads_versioned_unversioned_and_single_bundle_layouts(
    fr_en_bundle: Path, tmp_path: Path
):
    add_version(tmp_path, "fr-en", 1, fr_en_bundle)
    add_version(tmp_path, "fr-en", 12, fr_en_bundle)
    (tmp_path / "fr-en" / "notes").mkdir()  # not a version: ignored
    (tmp_path / "fr-en" / "3").mkdir()  # a version folder without a bundle.json yet: ignored
    add_version(tmp_path, "other", None, fr_en_bundle)
    (tmp_path / "empty").mkdir()
    models = ModelRepository(tmp_path).scan()
    assert sorted(models) == ["fr-en", "other"]
    assert sorted(models["fr-en"].versions) == [1, 12]
    assert list(models["other"].versions) == [None]
    assert ModelRepository(tmp_path).entry("empty") is None
    assert ModelRepository(tmp_path).entry("../fr-en") is None
    single = ModelRepository(fr_en_bundle).scan()
    assert list(single) == ["fr-en"] and list(single["fr-en"].versions) == [None]
    with pytest.raises(BundleError, match="does not exist"):
        ModelRepository(tmp_path / "missing").scan()
    with pytest.raises(BundleError, match="no bundle under"):
        ModelRepository(tmp_path / "empty").scan()


@pytest.fixture
def repository(fr_en_bundle: Path, tmp_path: Path) -> Path:
    add_version(tmp_path, "fr-en", 1, fr_en_bundle)
    return tmp_path


def test_at_start_the_newest_version_that_loads_serves(repository: Path, fr_en_bundle: Path):
    add_version(repository, "fr-en", 2, fr_en_bundle)
    break_version(add_version(repository, "fr-en", 3, fr_en_bundle))
    registry = registry_of(repository)
    registry.load_all()
    try:
        model = registry.get("fr", "en")
        assert (model.name, model.version) == ("fr-en", 2)
        states = {(v.version, v.state) for v in registry.versions()}
        assert states == {(2, "ready"), (3, "failed")}
        (failed,) = [v for v in registry.versions() if v.state == "failed"]
        assert "does not match its bundle.json" in failed.reason
        (described,) = registry.describe()
        assert described["version"] == 2 and described["state"] == "ready"
        assert [v["state"] for v in described["versions"]] == ["ready", "failed"]
    finally:
        registry.close()


def test_a_new_version_serves_after_load_and_the_old_one_is_unloaded(
    repository: Path, fr_en_bundle: Path
):
    registry = registry_of(repository)
    registry.load_all()
    try:
        old = registry.get("fr", "en")
        assert old.version == 1
        add_version(repository, "fr-en", 2, fr_en_bundle)
        serving = registry.load("fr-en")
        assert serving.version == 2 and registry.get("fr", "en").version == 2
        wait_for(lambda: [v.version for v in registry.versions()] == [2])
        assert not old.loop.alive  # its loop was closed
        # Its gauges went with it (a stale one would count in every sum by model).
        metrics = registry.metrics
        assert metrics is not None
        gauge = "nmt_queue_capacity"
        assert metrics.registry.get_sample_value(gauge, {"model": "fr-en", "version": "1"}) is None
        assert metrics.registry.get_sample_value(gauge, {"model": "fr-en", "version": "2"}) > 0
    finally:
        registry.close()


def test_a_broken_version_is_refused_with_its_reason_and_the_old_one_keeps_serving(
    repository: Path, fr_en_bundle: Path
):
    registry = registry_of(repository)
    registry.load_all()
    try:
        break_version(add_version(repository, "fr-en", 2, fr_en_bundle))
        with pytest.raises(ModelLoadFailed, match=r"version 2: .*checksum.*version 1 serves"):
            registry.load("fr-en")
        assert registry.get("fr", "en").version == 1
        assert {(v.version, v.state) for v in registry.versions()} == {
            (1, "ready"),
            (2, "failed"),
        }
        metrics = registry.metrics
        assert metrics is not None
        failed = {"model": "fr-en", "version": "2", "outcome": "failed"}
        assert metrics.registry.get_sample_value("nmt_model_loads_total", failed) == 1
    finally:
        registry.close()


def test_a_version_whose_warm_up_fails_is_refused_and_the_old_one_keeps_serving(
    repository: Path, fr_en_bundle: Path, monkeypatch: pytest.MonkeyPatch
):
    registry = registry_of(repository, warmup=True)
    registry.load_all()  # version 1 warms up for real
    try:
        add_version(repository, "fr-en", 2, fr_en_bundle)

        def out_of_memory(translator, beam_size: int) -> None:
            # What ONNX Runtime raises when the first runs cannot allocate their buffers.
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate")

        monkeypatch.setattr(registry_module, "_warm_up", out_of_memory)
        with pytest.raises(ModelLoadFailed, match=r"version 2: .*Failed to allocate.*version 1"):
            registry.load("fr-en")
        serving = registry.get("fr", "en")
        assert serving.version == 1
        assert [t.text for t in serving.translator.translate(["Un chien."])] == ["A dog."]
        assert {(v.version, v.state) for v in registry.versions()} == {
            (1, "ready"),
            (2, "failed"),
        }
    finally:
        registry.close()


def test_latest_two_serves_both_versions_and_requests_go_to_the_newest(
    repository: Path, fr_en_bundle: Path
):
    add_version(repository, "fr-en", 2, fr_en_bundle)
    add_version(repository, "fr-en", 3, fr_en_bundle)
    registry = registry_of(repository, model_version_policy="latest:2")
    registry.load_all()
    try:
        assert registry.get("fr", "en").version == 3
        assert {(v.version, v.state) for v in registry.versions()} == {(3, "ready"), (2, "ready")}
        assert registry.get("fr", "en", version=2).version == 2  # a request may name one
        with pytest.raises(ModelVersionUnknown):
            registry.get("fr", "en", version=1)
    finally:
        registry.close()


def test_specific_versions_serve_exactly_those(repository: Path, fr_en_bundle: Path):
    add_version(repository, "fr-en", 2, fr_en_bundle)
    add_version(repository, "fr-en", 3, fr_en_bundle)
    registry = registry_of(repository, model_version_policy="specific:1,2")
    registry.load_all()
    try:
        assert registry.get("fr", "en").version == 2
        assert sorted(v.version for v in registry.versions()) == [1, 2]
    finally:
        registry.close()


def test_loading_an_older_version_rolls_back_until_the_next_plain_load(
    repository: Path, fr_en_bundle: Path
):
    add_version(repository, "fr-en", 2, fr_en_bundle)
    registry = registry_of(repository)
    registry.load_all()
    try:
        assert registry.get("fr", "en").version == 2
        assert registry.load("fr-en", 1).version == 1
        assert registry.get("fr", "en").version == 1 and registry.pinned("fr-en") == 1
        with pytest.raises(ModelVersionUnknown, match="its versions: 1, 2"):
            registry.load("fr-en", 9)
        assert registry.load("fr-en").version == 2  # back to the policy: the newest
        assert registry.pinned("fr-en") is None
    finally:
        registry.close()


def test_a_retired_version_stays_open_while_a_request_holds_it(
    repository: Path, fr_en_bundle: Path
):
    registry = registry_of(repository)
    registry.load_all()
    try:
        old = registry.get("fr", "en")
        with registry.lease(old) as held:
            assert held is old
            add_version(repository, "fr-en", 2, fr_en_bundle)
            registry.load("fr-en")
            assert registry.get("fr", "en").version == 2
            time.sleep(0.2)
            assert old.loop.alive  # held: not closed under the request
            assert [v.state for v in registry.versions()] == ["unloading", "ready"]
        wait_for(lambda: not old.loop.alive)
        # A request that looked the old version up before the switch, and asks to hold it
        # only now that it is closed, gets the version that replaced it.
        with registry.lease(old) as held:
            assert held.version == 2
    finally:
        registry.close()


def test_unloading_retires_every_version_and_the_pair_is_gone(repository: Path):
    registry = registry_of(repository)
    registry.load_all()
    try:
        model = registry.get("fr", "en")
        registry.unload("fr-en")
        with pytest.raises(UnknownPair, match="supported pairs: none"):
            registry.get("fr", "en")
        assert not registry.ready
        wait_for(lambda: registry.versions() == [])
        with pytest.raises(ModelUnavailable), registry.lease(model):
            pass
        registry.unload("fr-en")  # unloaded already: nothing to do
        with pytest.raises(ModelUnknown):
            registry.unload("de-en")  # in neither the registry nor the repository
        assert registry.load("fr-en").version == 1  # back from the repository
    finally:
        registry.close()


def test_a_policy_that_selects_no_version_says_so(repository: Path):
    registry = registry_of(repository, model_version_policy="specific:7")
    with pytest.raises(BundleError, match=r"specific:7 selects none of its versions \(1\)"):
        registry.load_all()
    registry.close()


def test_an_unknown_model_is_named_with_the_known_ones(repository: Path):
    registry = registry_of(repository)
    registry.load_all()
    try:
        with pytest.raises(ModelUnknown, match="'de-en'; models: fr-en"):
            registry.load("de-en")
    finally:
        registry.close()


def test_a_second_model_for_the_same_pair_is_refused(repository: Path, fr_en_bundle: Path):
    registry = registry_of(repository)
    registry.load_all()
    try:
        add_version(repository, "fr-en-copy", None, fr_en_bundle)
        with pytest.raises(ModelLoadFailed, match="already translates fr-en"):
            registry.load("fr-en-copy")
        assert registry.get("fr", "en").name == "fr-en"
    finally:
        registry.close()


def test_the_watch_loads_a_new_version_and_unloads_a_removed_model(
    repository: Path, fr_en_bundle: Path
):
    registry = registry_of(repository)
    registry.load_all()
    watch = RepositoryWatch(registry, interval=3600)  # turns driven by hand: check()
    watch._seen = registry.repository.fingerprint()
    try:
        watch.check()
        assert registry.get("fr", "en").version == 1  # nothing changed
        add_version(repository, "fr-en", 2, fr_en_bundle)
        watch.check()
        assert registry.get("fr", "en").version == 2
        shutil.rmtree(repository / "fr-en")
        watch.check()
        with pytest.raises(UnknownPair):
            registry.get("fr", "en")
    finally:
        registry.close()


def test_a_version_that_leaves_is_freed_although_the_heap_was_frozen_with_it(
    repository: Path, fr_en_bundle: Path
):
    # A load while serving settles the heap (heap.py): the loaded versions' objects are
    # frozen. The one retired must still be freed once it is closed.
    registry = registry_of(repository)
    registry.load_all()
    try:
        old_model = weakref.ref(registry.get("fr", "en"))
        add_version(repository, "fr-en", 2, fr_en_bundle)
        registry.load("fr-en")
        wait_for(lambda: [v.version for v in registry.versions()] == [2])
        wait_for(lambda: old_model() is None)
        # The load's settling and the unload's (on the closing thread) may overlap: once
        # both are done the heap is frozen.
        wait_for(lambda: gc.get_freeze_count() > 0)
    finally:
        registry.close()
        gc.unfreeze()
