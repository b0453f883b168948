"""Fixtures of the HTTP tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from tests.store.conftest import postgres_server, postgres_url  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    """The served model's translator, outside the server: what an answer must equal."""
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))
