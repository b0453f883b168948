"""Our checkpoint as LibreTranslate serves a model: an Argos Translate package, installed into
a LibreTranslate of its own (a virtual environment beside ours: its pins, Flask 2.2 and
prometheus-client 0.15 among them, are not ours).

An Argos package is a zip of one folder: `metadata.json` (the pair), `model/` (a CTranslate2
model), `sentencepiece.model` (Argos splits text into pieces with it, and joins them back), and
the sentence splitter's model. The CTranslate2 model is bench.compare's conversion of the same
checkpoint (through its Marian export), with `add_source_eos` set: Argos passes the pieces
without `</s>`, and our model was trained with it at the end of every source.

Sentence splitting: Argos's default, MiniSBD, downloads its model from GitHub on first use,
which a machine without internet cannot do. `--minisbd-model FILE` puts a MiniSBD model in
the package (what LibreTranslate runs by default); without one, the package holds a blank
spaCy French pipeline and Argos runs spaCy's rule-based sentencizer on it
(`ARGOS_CHUNK_TYPE=SPACY`): rules, no neural model, so cheaper than MiniSBD, and so the
comparison favours LibreTranslate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

LIBRETRANSLATE_PINS = ["libretranslate==1.9.6", "spacy==3.8.18"]
PACKAGE_NAME = "translate-fr_en"


def ensure_libretranslate(venv: Path) -> Path:
    """The Python of a virtual environment with LibreTranslate (made once, then reused)."""
    python = venv / "bin" / "python"
    stamp = venv / "installed.json"
    installed = json.loads(stamp.read_text()) if stamp.is_file() else None
    if python.is_file() and installed == LIBRETRANSLATE_PINS:
        return python
    print(f"installing {' '.join(LIBRETRANSLATE_PINS)} into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", *LIBRETRANSLATE_PINS], check=True)
    stamp.write_text(json.dumps(LIBRETRANSLATE_PINS))
    return python


def build_package(
    ct2_model: Path,
    sentencepiece_model: Path,
    out: Path,
    lt_python: Path,
    minisbd_model: Path | None,
) -> Path:
    """`out/fr_en.argosmodel`, made from scratch."""
    folder = out / PACKAGE_NAME
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    metadata = {
        "package_version": "1.0",
        "argos_version": "1.11",
        "from_code": "fr",
        "from_name": "French",
        "to_code": "en",
        "to_name": "English",
        "type": "translate",
        "description": "nmt-serve's committed fr-en checkpoint, for a side-by-side benchmark",
    }
    (folder / "metadata.json").write_text(json.dumps(metadata, indent=2))
    shutil.copytree(ct2_model, folder / "model")
    config_path = folder / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["add_source_eos"] = True  # Argos's pieces come without </s>; ours were trained with it
    config_path.write_text(json.dumps(config, indent=2))
    (folder / "model" / "vmap.txt").unlink(missing_ok=True)  # Argos never asks for the map
    shutil.copy(sentencepiece_model, folder / "sentencepiece.model")
    if minisbd_model is not None:
        (folder / "minisbd").mkdir()
        shutil.copy(minisbd_model, folder / "minisbd" / minisbd_model.name)
    else:
        # spaCy's own format for a pipeline on disk, written by spaCy (in LibreTranslate's venv)
        blank = f"import spacy; spacy.blank('fr').to_disk({str(folder / 'spacy')!r})"
        subprocess.run([lt_python, "-c", blank], check=True)
    archive = out / "fr_en.argosmodel"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(folder.rglob("*")):
            zipped.write(path, path.relative_to(out))
    shutil.rmtree(folder)
    return archive


def install_package(lt_python: Path, archive: Path, home: Path) -> None:
    """Installed as a user would (`argospm install` of a file), under a home of our own."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    install = (
        "import sys; from argostranslate import package; package.install_from_path(sys.argv[1])"
    )
    environment = argos_environment(home)
    subprocess.run([lt_python, "-c", install, str(archive)], check=True, env=environment)


def argos_environment(home: Path) -> dict[str, str]:
    """Where Argos keeps its packages, settings and caches (XDG folders): under `home`."""
    return {
        **os.environ,
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "ARGOS_DEVICE_TYPE": "cpu",
        "PYTHONWARNINGS": "ignore",  # requests' warning about chardet's version, at every start
    }
