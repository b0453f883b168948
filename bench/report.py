"""docs/benchmarks.md is shared by several benchmark scripts: each owns one marked section."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

BENCHMARKS = Path("docs/benchmarks.md")
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the script its command names; rerun it to refresh.\n"
)


def replace_section(key: str, markdown: str, path: Path = BENCHMARKS) -> None:
    """Put `markdown` between this key's markers, replacing what was there, keeping the rest."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def reproduce(module: str) -> str:
    """The command that ran this benchmark, with its arguments, for a report's "Reproduce"."""
    command = f".venv/bin/python -m {module}"
    if sys.argv[1:]:
        command += " " + shlex.join(sys.argv[1:])
    return command


def cpu_model() -> str:
    """The CPU's name, as lscpu gives it, with the vector instructions int8 matmuls depend on:
    a speed holds on the CPU it was measured on only (this project's machines are AMD EPYC
    and Intel Xeon of several generations, and a hypervisor may hide the exact model)."""
    name, flags = "unknown CPU", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    found = [label for flag, label in VECTOR_FEATURES if flag in flags]
    return f"{name} ({', '.join(found) or 'no AVX2'})"


# cpuinfo flags -> what a report calls them, widest first.
VECTOR_FEATURES = [
    ("amx_int8", "AMX"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx512f", "AVX-512"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx2", "AVX2"),
]


def machine() -> str:
    """The CPU and its core count, for a report's first bullet."""
    return f"{cpu_model()}, {platform.machine()}, {os.cpu_count()} CPU cores"


def opening(title: str, module: str, setup: str = "") -> list[str]:
    """A report's first lines: its title, the command that reproduces it, and a first bullet
    (when, and on what machine) that ends with `setup`."""
    return [
        f"## {title}",
        "",
        f"Reproduce: `{reproduce(module)}`",
        "",
        f"- when: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {machine()}{setup}",
    ]
