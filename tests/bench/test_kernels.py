"""bench/kernels.py: how a window of machine code is named, and how perf's report is read (a
benchmark: its shares are not checked; its end-to-end run needs perf, which CI lacks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kernels import SCALAR, _short, classify, functions, samples, shares


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ([("vmovdqu32", "(%rax),%zmm1"), ("vpdpbusds", "%zmm2,%zmm3,%zmm4")], "AVX-512 VNNI"),
        ([("vpdpbusd", "%ymm2,%ymm3,%ymm4")], "AVX-VNNI"),
        ([("tileloadd", "(%rax,%rcx,1),%tmm0"), ("tdpbusd", "%tmm1,%tmm2,%tmm0")], "AMX"),
        ([("vpmaddubsw", "%ymm1,%ymm2,%ymm3")], "AVX2 int8"),
        ([("vfmadd231ps", "%zmm1,%zmm2,%zmm3")], "other AVX-512"),
        ([("vaddps", "%ymm1,%ymm2,%ymm3")], "other AVX / AVX2"),
        ([("movups", "(%rdx),%xmm3"), ("mulps", "%xmm6,%xmm0")], "SSE"),
        # scalar float code moves xmm registers too: not vector code
        ([("movss", "%xmm0,-0x4(%rbp)"), ("movaps", "%xmm1,%xmm0"), ("add", "$0x1,%r11")], None),
        ([("cmp", "%r11,%rsp"), ("jne", "fbfa64")], None),
    ],
)
def test_a_window_is_named_by_its_most_telling_instruction(window, expected) -> None:
    name = classify(window)
    assert name == SCALAR if expected is None else name.startswith(expected), name


# Lines as `perf report --no-children --sort dso,sym -g none --stdio` writes them.
REPORT = """\
# Overhead  Shared Object  Symbol
    43.40%  [JIT] tid 21867                       [.] 0x00007fa73a35f05e
    13.40%  libc.so.6                             [.] __memmove_avx512_unaligned_erms
     6.80%  libctranslate2-a7a60d30.so.4.8.5      [.] void ctranslate2::cpu::quantize_s8<(ctranslate2::cpu::CpuIsa)2>(float const*, signed char*, float*, long, long, bool, bool)
     6.70%  libctranslate2-a7a60d30.so.4.8.5      [.] ctranslate2::cpu::softmax<(ctranslate2::cpu::CpuIsa)2>(float const*, int const*, float*, long, long, bool)::{lambda(long, long)#1}::operator()(long, long) const
     2.00%  [JIT] tid 21867                       [.] 0x00007fa73a35f065
     1.00%  [kernel.kallsyms]                     [k] clear_page_erms
"""  # noqa: E501


def test_perf_report_lines_are_read_whole() -> None:
    found = samples(REPORT)
    assert [(p, library) for p, library, _ in found] == [
        (43.4, "[JIT] tid 21867"),
        (13.4, "libc.so.6"),
        (6.8, "libctranslate2-a7a60d30.so.4.8.5"),
        (6.7, "libctranslate2-a7a60d30.so.4.8.5"),
        (2.0, "[JIT] tid 21867"),
        (1.0, "[kernel.kallsyms]"),
    ]
    assert found[2][2].startswith("void ctranslate2::cpu::quantize_s8<")


def test_functions_are_named_without_templates_and_generated_code_is_one() -> None:
    top = dict(functions(REPORT, top=10))
    assert top["code generated at run time (oneDNN's JIT GEMM kernels)"] == pytest.approx(45.4)
    assert top["ctranslate2::cpu::quantize_s8"] == pytest.approx(6.8)
    assert top["ctranslate2::cpu::softmax"] == pytest.approx(6.7)
    assert _short("std::__adjust_heap<int*, long>(int*, long)") == "std::__adjust_heap"


def test_samples_outside_onnx_runtime_are_named_by_library() -> None:
    found = shares(REPORT, Path("onnxruntime_pybind11_state.so"))  # (none of its samples)
    assert found == {
        "code generated at run time": pytest.approx(45.4),
        "libc: memmove / memcpy": pytest.approx(13.4),
        "other: libctranslate2-a7a60d30.so.4.8.5": pytest.approx(13.5),
        "operating system": pytest.approx(1.0),
    }
