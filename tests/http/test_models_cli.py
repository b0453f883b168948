"""`nmt models`: model control of a running server from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.servers import running_server
from tests.serving.test_registry import add_version, break_version


def nmt_models(url: str, *args: str, key: str = "admin-1") -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "nmt_cli", "models", "--url", url, "--key", key, *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_models_are_listed_loaded_and_unloaded_from_the_command_line(
    fr_en_bundle: Path, tmp_path: Path, logs: Path
):
    repository = tmp_path / "repository"
    add_version(repository, "fr-en", 1, fr_en_bundle)
    with running_server(repository, logs, threads=1, admin_keys="admin-1") as server:
        listed = nmt_models(server.url, "list")
        assert listed.returncode == 0, listed.stderr
        (model,) = json.loads(listed.stdout)["models"]
        assert (model["name"], model["version"]) == ("fr-en", 1)

        add_version(repository, "fr-en", 2, fr_en_bundle)
        loaded = nmt_models(server.url, "load", "fr-en")
        assert loaded.returncode == 0 and json.loads(loaded.stdout)["version"] == 2

        break_version(add_version(repository, "fr-en", 3, fr_en_bundle))
        refused = nmt_models(server.url, "load", "fr-en")
        assert refused.returncode == 1
        assert "409" in refused.stderr and "version 3" in refused.stderr

        back = nmt_models(server.url, "load", "fr-en", "--version", "1")
        assert back.returncode == 0 and json.loads(back.stdout)["version"] == 1

        wrong_key = nmt_models(server.url, "unload", "fr-en", key="nope")
        assert wrong_key.returncode == 1 and "403" in wrong_key.stderr
        assert nmt_models(server.url, "unload", "fr-en").returncode == 0
        not_ready = nmt_models(server.url, "ready", "fr-en")
        assert not_ready.returncode == 1 and "503" in not_ready.stderr
    unreachable = nmt_models(server.url, "list")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
