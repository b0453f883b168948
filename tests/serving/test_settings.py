"""Settings come from NMT_* variables, and docs/service.md documents every one as it is."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from service.serving.settings import Settings
from tests.conftest import ROOT


def documented() -> dict[str, str]:
    """name -> default, from the settings table of docs/service.md."""
    text = (ROOT / "docs" / "service.md").read_text()
    rows = re.findall(r"^\| `(NMT_[A-Z0-9_]+)` \| ([^|]+) \|", text, flags=re.MULTILINE)
    return {name: default.strip().strip("`") for name, default in rows}


def test_every_setting_is_documented_with_its_default():
    table = documented()
    for name, field in Settings.model_fields.items():
        variable = f"NMT_{name.upper()}"
        assert variable in table, f"{variable} is missing from docs/service.md"
        default = field.default
        shown = str(default).lower() if isinstance(default, bool) else str(default)
        assert table[variable] == (shown or "(empty)"), variable
    assert set(table) == {f"NMT_{name.upper()}" for name in Settings.model_fields}


def test_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NMT_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("NMT_MODEL_DIR", "/srv/bundles")
    monkeypatch.setenv("NMT_INT8", "true")
    settings = Settings()
    assert settings.max_batch_size == 7
    assert str(settings.model_dir) == "/srv/bundles"
    assert settings.int8 is True


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("NMT_MAX_BATCH_SIZE", "0", "greater than 0"),
        ("NMT_PORT", "70000", "less than or equal to 65535"),
        ("NMT_DEFAULT_BEAM_SIZE", "12", "NMT_MAX_BEAM_SIZE=8"),
        ("NMT_ENCODE_AHEAD", "yes", "'auto', 'true' or 'false'"),
    ],
)
def test_bad_settings_are_refused_clearly(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, words: str
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=words):
        Settings()


@pytest.mark.parametrize(
    ("threads", "told", "on"),
    [(1, "auto", True), (2, "auto", False), (2, "true", True), (1, "false", False)],
)
def test_encoding_ahead_is_on_by_default_only_with_one_engine_thread(
    threads: int, told: str, on: bool
):
    assert Settings(threads=threads, encode_ahead=told).encodes_ahead is on
