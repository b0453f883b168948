"""Graphs too large for one protobuf (2 GB: the decoder steps of NLLB-200 and mBART-50, whose
256k-word embeddings are both input and output projection) keep their weights in one file
beside them, NAME.onnx.data, which the bundle lists and checks like any other file. Held here
on the tiny model with the threshold at 0, so that every graph does so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from export import onnx_export  # noqa: E402
from service.runtime.bundle import BundleError, load_bundle  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402
from service.runtime.sessions import EngineOptions  # noqa: E402
from tests.runtime.steps import full_log_probs  # noqa: E402

GRAPHS = ("encoder.onnx", "decoder.onnx", "encoder.int8.onnx", "decoder.int8.onnx")


@pytest.fixture(scope="module")
def external_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("external") / "tiny"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 0)
        onnx_export.export_bundle(tiny_checkpoint, out, int8=True)
    return out


def test_every_graph_keeps_its_weights_beside_it_listed_in_bundle_json(external_bundle: Path):
    files = json.loads((external_bundle / "bundle.json").read_text())["files"]
    for graph in GRAPHS:
        assert graph + ".data" in files
        data = (external_bundle / (graph + ".data")).stat()
        assert (external_bundle / graph).stat().st_size < data.st_size  # the weights are out
        # as readable as the graph (a server may run as another user than the export)
        assert data.st_mode == (external_bundle / graph).stat().st_mode


@pytest.mark.parametrize("int8", [False, True])
def test_the_engine_steps_alike_from_either_layout(
    tiny_bundle: Path, external_bundle: Path, int8: bool
) -> None:
    options = EngineOptions(intra_op_threads=1, int8=int8)
    engines = [Engine(load_bundle(path), options) for path in (tiny_bundle, external_bundle)]
    source = np.array([[5, 17, 42, 9, 1]])
    states = [engine.start(source, source > 0) for engine in engines]
    for token in (0, 33, 7, 250):
        found, expected = (
            full_log_probs(engine, state, np.array([token]))[0]
            for engine, state in zip(reversed(engines), reversed(states), strict=True)
        )
        np.testing.assert_allclose(found, expected, atol=1e-5)


def test_an_altered_data_file_is_refused(external_bundle: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "tiny"
    shutil.copytree(external_bundle, copy)
    with open(copy / "decoder.onnx.data", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(BundleError, match=r"decoder\.onnx\.data has checksum"):
        load_bundle(copy)
