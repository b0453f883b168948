"""Which instructions a translation's time is spent in: int8 VNNI or AMX, AVX-512, SSE, Python.

    python -m bench.kernels --bundle build/models/fr-en --cells 1x1 4x32

Issue 39 asked what ONNX Runtime runs for our int8 matmuls on a CPU with VNNI or AMX: which
kernel MLAS picks, and whether AMX is used. ONNX Runtime's profiler names operators, not
kernels, and its library has no symbols. So this samples the machine code itself:

* each cell (beam x batch) translates test sentences with the engine (int8, one thread) for
  a while under `perf record` (Linux perf, the `linux-perf` package);
* every sample in ONNX Runtime's library is placed in the code around it, disassembled once
  with `objdump`, and that code is named by the most telling instruction within 64 bytes:
  AMX tile multiplies (`tdpbusd`), VNNI multiply-adds (`vpdpbusd`, on zmm: AVX-512 VNNI; on
  ymm: AVX-VNNI), AVX2's `vpmaddubsw`, other AVX-512 / AVX code, SSE code (128-bit, not
  VEX-encoded: compiled for the baseline), else scalar;
* samples elsewhere are named by library: libc (memmove: copies), Python, numpy, the kernel.

Writes the "kernels" section of docs/performance.md. A share is of the samples of the whole
process (loading excluded: sampling starts once the bundle is loaded and warm).
"""

from __future__ import annotations

import argparse
import bisect
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.report import opening, replace_section

# Instruction classes, most telling first: a window of code is named by the first that occurs.
# Each is (name, mnemonic pattern, register the operands must name; None: any).
CLASSES = [
    ("AMX int8 (tdpbusd)", r"tdpb[su][su]d", None),
    ("AVX-512 VNNI int8 (vpdpbusd, zmm)", r"vpdpb[su][su]ds?", "%zmm"),
    ("AVX-VNNI int8 (vpdpbusd, ymm)", r"vpdpb[su][su]ds?", "%ymm"),
    ("AVX2 int8 (vpmaddubsw)", r"vpmaddubsw", None),
    ("other AVX-512 (zmm)", r"v.*", "%zmm"),
    ("other AVX / AVX2 (ymm)", r"v.*", "%ymm"),
    # packed float arithmetic and loads without VEX: code compiled for the x86-64 baseline
    ("SSE (packed, not VEX-encoded)", r"(mul|add|sub|max|min|div)p[sd]|movup[sd]", None),
]
SCALAR = "scalar and other"
WINDOW = 64  # bytes of code either side of a sample that name it


def disassembly(library: Path) -> tuple[list[int], list[tuple[str, str]]]:
    """Every instruction's address, and its mnemonic and operands, in address order."""
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    addresses, instructions = [], []
    for line in listing.splitlines():
        match = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if match:
            addresses.append(int(match.group(1), 16))
            instructions.append((match.group(2), match.group(3)))
    return addresses, instructions


def classify(window: list[tuple[str, str]]) -> str:
    """The class of a window of code (mnemonic, operands): the first of CLASSES it shows."""
    for name, mnemonic, register in CLASSES:
        for op, operands in window:
            if re.fullmatch(mnemonic, op) and (register is None or register in operands):
                return name
    return SCALAR


def code_class(address: int, addresses: list[int], instructions: list[tuple[str, str]]) -> str:
    start = bisect.bisect_left(addresses, address - WINDOW)
    stop = bisect.bisect_right(addresses, address + WINDOW)
    return classify(instructions[start:stop])


def samples(report: str) -> list[tuple[float, str, str]]:
    """(percent, library, symbol or address) of each line of `perf report --sort dso,sym`."""
    found = []
    for line in report.splitlines():
        # (a library's name may hold spaces, "[JIT] tid 123", and a C++ symbol does)
        match = re.match(r"^\s*([0-9.]+)%\s+(.+?)\s+\[[.k]\]\s+(.+?)\s*$", line)
        if match:
            found.append((float(match.group(1)), match.group(2), match.group(3)))
    return found


def library_group(library: str, symbol: str) -> str:
    if library.startswith("[JIT]"):
        return "code generated at run time"
    name = Path(library).name
    if name.startswith("libc.so"):
        return "libc: memmove / memcpy" if "mem" in symbol else "libc: other"
    if "python" in name:
        return "Python interpreter"
    if "_multiarray" in name or "numpy" in library:
        return "numpy"
    if "kernel" in name:
        return "operating system"
    return f"other: {name}"


def shares(report: str, ort_library: Path) -> Counter[str]:
    """Percent of the samples by class of code (ONNX Runtime) or library (the rest)."""
    code = None  # ONNX Runtime's disassembly, made at its first sample
    found: Counter[str] = Counter()
    for percent, library, symbol in samples(report):
        if Path(library).name == ort_library.name and symbol.startswith("0x"):
            code = code or disassembly(ort_library)
            found[f"ONNX Runtime: {code_class(int(symbol, 16), *code)}"] += percent
        else:
            found[library_group(library, symbol)] += percent
    return found


def functions(report: str, top: int) -> list[tuple[str, float]]:
    """The `top` functions by share (C++ names without their template and argument lists);
    generated code (oneDNN's GEMM kernels, made at run time) is one entry."""
    found: Counter[str] = Counter()
    for percent, library, symbol in samples(report):
        if library.startswith("[JIT]"):
            name = "code generated at run time (oneDNN's JIT GEMM kernels)"
        elif symbol.startswith("0x"):
            name = f"{Path(library).name} (no symbols)"
        else:
            name = _short(symbol)
        found[name] += percent
    return found.most_common(top)


def _short(symbol: str) -> str:
    """void ctranslate2::cpu::softmax<(ctranslate2::cpu::CpuIsa)2>(float const*, ...)::{lambda
    ...} -> ctranslate2::cpu::softmax"""
    depth, kept = 0, []
    for char in symbol:
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif depth == 0:
            kept.append(char)
    name = "".join(kept).split("::{lambda")[0].removesuffix("::operator")
    return name.split(" ")[-1]  # (no return type)


def onnxruntime_library() -> Path:
    import onnxruntime

    folder = Path(onnxruntime.__file__).parent / "capi"
    return next(folder.glob("onnxruntime_pybind11_state*.so"))


def test_sentences() -> list[str]:
    """What every cell translates: the first 256 lines of test_2016_flickr.fr."""
    from export.data import read_lines
    from export.train_config import multi30k_dir

    return read_lines(multi30k_dir() / "test_2016_flickr.fr")[:256]


def decode(bundle: Path, beam: int, batch: int, seconds: float, ready: Path) -> None:
    """The sampled process: translate test sentences again and again, after `ready` exists."""
    from service.runtime.bundle import load_bundle
    from service.runtime.search import SearchOptions
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator

    lines = test_sentences()
    translator = Translator(load_bundle(bundle), EngineOptions(int8=True, intra_op_threads=1))
    options = SearchOptions(beam_size=beam)
    translator.translate(lines[:batch], options, batch)  # warm
    ready.touch()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        translator.translate(lines, options, batch)


def decode_ctranslate2(compare: Path, beam: int, batch: int, seconds: float, ready: Path) -> None:
    """The same for CTranslate2 int8 on the same weights: `python -m bench.compare`'s
    conversion (compare/ct2) and SentencePiece model (compare/hf), its default patience
    there (2: it searches as far as ours)."""
    import ctranslate2
    import sentencepiece

    lines = test_sentences()
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(compare / "hf/source.spm"))
    sources = [[*pieces.encode(line, out_type=str), "</s>"] for line in lines]
    translator = ctranslate2.Translator(
        str(compare / "ct2"), device="cpu", compute_type="int8", intra_threads=1
    )

    def translate(batch_of: list[list[str]]) -> None:
        translator.translate_batch(batch_of, beam_size=beam, max_batch_size=batch, patience=2)

    translate(sources[:batch])  # warm
    ready.touch()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        translate(sources)


def record(engine: str, model: Path, beam: int, batch: int, seconds: float, folder: Path) -> str:
    """`perf report` of one engine's cell: its decoding process sampled once it is warm."""
    cell = f"{engine}-{beam}x{batch}"
    ready, data = folder / f"ready-{cell}", folder / f"perf-{cell}.data"
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.kernels", f"--decode-{engine}", str(model), str(beam),
         str(batch), str(seconds + 30), str(ready)],
    )  # fmt: skip
    try:
        while not ready.exists():
            if child.poll() is not None:
                raise RuntimeError(f"the decoding process exited with {child.returncode}")
            time.sleep(0.1)
        subprocess.run(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", str(child.pid),
             "-o", str(data), "--", "sleep", str(seconds)],
            check=True, capture_output=True,
        )  # fmt: skip
    finally:
        child.kill()
        child.wait()
    return subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "-g", "none",
         "--stdio", "--percent-limit", "0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def table(found: dict[str, Counter[str]]) -> list[str]:
    names = sorted({name for cell in found.values() for name in cell})
    names.sort(key=lambda name: -max(cell.get(name, 0.0) for cell in found.values()))
    lines = [
        "| code | " + " | ".join(found) + " |",
        "|---|" + "---:|" * len(found),
    ]
    for name in names:
        row = " | ".join(f"{cell.get(name, 0.0):.1f}%" for cell in found.values())
        lines.append(f"| {name} | {row} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--decode-ours", "--decode-ctranslate2"):
        run = decode if argv[0] == "--decode-ours" else decode_ctranslate2
        model, beam, batch, seconds, ready = argv[1:]
        run(Path(model), int(beam), int(batch), float(seconds), Path(ready))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__)
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--cells", nargs="+", default=["1x1", "4x32"], help="BEAMxBATCH")
    parser.add_argument("--seconds", type=float, default=15.0, help="sampled, per cell")
    parser.add_argument(
        "--ctranslate2",
        type=Path,
        help="also CTranslate2 int8, from `python -m bench.compare`'s work folder (build/compare)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args(argv)
    for tool in ("perf", "objdump"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing (apt-get install linux-perf binutils)", file=sys.stderr)
            return 2
    library = onnxruntime_library()
    found: dict[str, Counter[str]] = {}
    theirs: dict[str, list[tuple[str, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for cell in args.cells:
            beam, batch = (int(part) for part in cell.split("x"))
            name = f"beam {beam}, batch {batch}"
            report = record("ours", args.bundle.resolve(), beam, batch, args.seconds, Path(folder))
            found[name] = shares(report, library)
            if args.ctranslate2:
                compare = args.ctranslate2.resolve()
                report = record("ctranslate2", compare, beam, batch, args.seconds, Path(folder))
                theirs[name] = functions(report, top=12)
            print(f"  {cell}: sampled", flush=True)
    lines = opening(
        "Which instructions the time is spent in",
        "bench.kernels",
        f"; ours int8, one thread; {args.seconds:.0f} s sampled per cell by `perf record` "
        "(2,000 samples a second); share of the process's samples",
    )
    lines += ["", *table(found)]
    for name, top in theirs.items():
        lines += ["", f"CTranslate2 int8 (patience 2), {name}: its functions by share", ""]
        lines += ["| function | share |", "|---|---:|"]
        lines += [f"| {function} | {share:.1f}% |" for function, share in top]
    text = "\n".join(lines) + "\n"
    replace_section("kernels", text, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
