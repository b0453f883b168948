"""bench/ measures the product from outside: through its public API and the observer hooks it
offers, never by patching it. A benchmark that wraps a private method measures code that a
refactoring renames without a failing test (bench.decoder_thread did, and needed a test that
guarded its targets' names); these checks keep the next one from doing it again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCH_FILES = sorted((ROOT / "bench").rglob("*.py"))


# What a benchmark must not patch: the product, and the runtime library it runs on.
PRODUCT = ("service", "export", "nmt_contract", "nmt_cli", "onnxruntime")


def imported_names(tree: ast.AST) -> dict[str, str]:
    """The names a module binds by importing (modules, classes, functions): name -> the top
    package it came from."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = node.module.split(".")[0]
    return names


def base_name(node: ast.expr) -> str | None:
    """`a` of `a.b.c`, or None when the chain does not start at a name."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def trespasses(source: str) -> list[str]:
    """What in `source` patches or reaches into the product: setattr calls, assignments to an
    attribute of a module or class imported from it, functions of this file put in place of
    another object's method, private attributes (`_x`) of anything but self, cls and what
    came from elsewhere (the standard library's own), private names imported from it."""
    tree = ast.parse(source)
    imported = imported_names(tree)
    product = {name for name, package in imported.items() if package in PRODUCT}
    elsewhere = set(imported) - product
    functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    found = []
    for node in ast.walk(tree):
        called = (
            node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""
        )
        if called in ("setattr", "delattr"):
            found.append(f"line {node.lineno}: {called}()")
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            wrapper = isinstance(node.value, ast.Name) and node.value.id in functions
            if base_name(target) in product or (wrapper and base_name(target) != "self"):
                found.append(f"line {node.lineno}: assigns {ast.unparse(target)}")
        if isinstance(node, ast.Attribute):
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if private and base_name(node) not in {"self", "cls", *elsewhere}:
                found.append(f"line {node.lineno}: reads {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PRODUCT:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
    return found


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_benchmarks_use_the_product_from_outside(path: Path) -> None:
    assert not trespasses(path.read_text())


def test_the_check_finds_the_ways_a_benchmark_used_to_patch_the_product() -> None:
    # What bench/decoder_thread.py, bench/compare/profiling.py and bench/scheduler_overhead.py
    # did before the product offered hooks.
    patched = """
import onnxruntime as ort
from service.runtime.engine import Engine
from service.serving.loop import DecodingLoop

setattr(DecodingLoop, "work_once", timed)
ort.InferenceSession.run = timed
Engine._run_in_place = timed
batch._step_apart(batch)

def timed_step():
    return step()

batch.step = timed_step
"""
    assert set(trespasses(patched)) == {
        "line 6: setattr()",
        "line 7: assigns ort.InferenceSession.run",
        "line 8: assigns Engine._run_in_place",
        "line 8: reads Engine._run_in_place",
        "line 9: reads batch._step_apart",
        "line 14: assigns batch.step",
    }
    own = "import sys\nclass Timer:\n    def __init__(self):\n        self._seconds = 0.0\n"
    assert trespasses(own + "sys.stdout = sys.stderr\nsys._getframe()\n") == []
