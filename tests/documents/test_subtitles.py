"""Subtitles: SRT and WebVTT files written as text, translated through SrtFormat and
VttFormat, read back with `srt` and webvtt-py. What must hold: cues keep their numbers,
identifiers, timings and settings; NOTE, STYLE and REGION blocks are copied; a sentence that
runs over two cues is translated once and shared between them; inline tags land on the
translation of the words they wrapped; an identity translation writes the same bytes."""

from __future__ import annotations

import codecs
import re

import pytest
import srt
import webvtt

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.subtitles import SrtFormat, VttFormat
from service.documents.formats.text import TxtFormat, plain_text
from tests.documents.conftest import SegmentTranslator

SRT = (
    "1\r\n00:00:01,000 --> 00:00:02,500\r\nUn homme marche dans\r\n\r\n"
    "2\r\n00:00:02,600 --> 00:00:04,000 X1:100 X2:200 Y1:10 Y2:20\r\nla rue avec son chien.\r\n\r\n"
    "3\r\n00:00:05,000 --> 00:00:07,000\r\nUn chien <i>noir</i> court dans l'herbe.\r\n\r\n"
    '4\r\n00:00:08,000 --> 00:00:10,000\r\n{\\an8}<font color="#ffff00">Une femme chante</font>\r\n'
    "dans le parc.\r\n\r\n"
    "5\r\n00:00:11,000 --> 00:00:13,000\r\n- Deux hommes jouent au football.\r\n"
    "- Un garçon saute dans l'eau.\r\n\r\n"
    "6\r\n00:00:14,000 --> 00:00:15,000\r\n♪ ♪\r\n"
)

HEADER = "WEBVTT - Un film\nKind: captions\n\n"
NOTE = "NOTE Une note qui\nn'est pas traduite\n\n"
STYLE = "STYLE\n::cue(.jaune) { color: yellow }\n\n"
REGION = "REGION\nid:bas\nwidth:40%\n\n"
VTT = (
    HEADER
    + NOTE
    + STYLE
    + REGION
    + "debut\n00:01.000 --> 00:02.500 align:start line:90% region:bas\n"
    "<v Roger>Un homme marche dans\n\n"
    "00:02.600 --> 00:04.000\n<v Roger>la rue avec son chien.\n\n"
    "NOTE entre deux cues\n\n"
    "00:00:05.000 --> 00:00:07.000\nUn chien <b>noir</b> court dans l'herbe.\n\n"
    "00:08.000 --> 00:10.000\n<c.jaune>Une femme</c> <00:09.000>chante &amp; danse.\n"
)


def _srt_cues(data: bytes) -> list[srt.Subtitle]:
    return list(srt.parse(data.decode("utf-8")))


def _vtt_captions(data: bytes) -> list[webvtt.Caption]:
    return webvtt.WebVTT.from_string(data.decode("utf-8")).captions


def _untagged(text: str) -> str:
    return re.sub(r"<[^>]*>|\{\\[^}]*\}", "", text)


def test_sniff() -> None:
    assert SrtFormat.sniff(SRT.encode()) and not VttFormat.sniff(SRT.encode())
    assert VttFormat.sniff(VTT.encode()) and not SrtFormat.sniff(VTT.encode())
    assert SrtFormat.sniff(codecs.BOM_UTF8 + SRT.encode())
    assert SrtFormat.sniff(codecs.BOM_UTF16_LE + SRT.encode("utf-16-le"))
    assert SrtFormat.sniff(
        SRT.replace("♪", "*").encode("cp1252")
    )  # extract() says why it is not read
    assert not SrtFormat.sniff(b"1\nUn chien noir.\n")
    assert not VttFormat.sniff(b"WEBVTTX\n")
    assert not SrtFormat.sniff(b"Un chien noir court.") and TxtFormat.sniff(b"Un chien.")


def test_srt_segments_join_a_sentence_over_cues() -> None:
    assert SrtFormat.extract(SRT.encode(), DocumentLimits()).segments == [
        "Un homme marche dans la rue avec son chien.",  # cues 1 and 2
        "Un chien <s1>noir</s1> court dans l'herbe.",
        "Une femme chante<s1> dans le parc.</s1>",  # two lines of one cue, its code kept out
        "Deux hommes jouent au football.",  # a dialogue cue: one segment a line
        "Un garçon saute dans l'eau.",
    ]


def test_vtt_segments() -> None:
    assert VttFormat.extract(VTT.encode(), DocumentLimits()).segments == [
        "Un homme marche dans la rue avec son chien.",
        "Un chien <s1>noir</s1> court dans l'herbe.",
        "<s0>Une femme </s0><p0/>chante &amp; danse.",
    ]


@pytest.mark.parametrize(
    "data",
    [
        SRT.encode(),
        SRT.replace("\r\n", "\n").encode(),
        codecs.BOM_UTF8 + SRT.encode(),
        codecs.BOM_UTF16_LE + SRT.encode("utf-16-le"),
        SRT.replace(",", ".", 2).encode(),  # a timing written with dots: kept as written
    ],
)
def test_srt_identity_translation_writes_the_same_bytes(data: bytes) -> None:
    extracted = SrtFormat.extract(data, DocumentLimits())
    assert extracted.write(extracted.segments) == data


@pytest.mark.parametrize("text", [VTT, VTT.replace("\n", "\r\n"), "\ufeff" + VTT])
def test_vtt_identity_translation_writes_the_same_bytes(text: str) -> None:
    data = text.encode()
    extracted = VttFormat.extract(data, DocumentLimits())
    assert extracted.write(extracted.segments) == data


def test_srt_translated_as_the_text_api_translates(translate_segments: SegmentTranslator) -> None:
    data = SRT.encode()
    extracted = SrtFormat.extract(data, DocumentLimits())
    translations = translate_segments(extracted.segments, SrtFormat)
    out = extracted.write(translations)
    before, after = _srt_cues(data), _srt_cues(out)
    assert [(c.index, c.start, c.end, c.proprietary) for c in after] == [
        (c.index, c.start, c.end, c.proprietary) for c in before
    ]
    assert b"\r\n\r\n" in out and b"\n" not in out.replace(b"\r\n", b"")
    texts = [cue.content for cue in after]
    # The sentence over cues 1 and 2 was translated once, and both cues hold a share of it.
    first, second = texts[0], texts[1]
    assert first and second and "\n" not in first + second
    assert f"{first} {second}" == plain_text(translations[0])
    assert 0.3 < len(first) / len(first + second) < 0.7
    # Each other segment is its cue, tags and codes kept where they belong.
    assert texts[2] == "<i>".join(translations[1].split("<s1>")).replace("</s1>", "</i>")
    assert re.search(r"<i>black</i>", texts[2])
    assert texts[3].startswith('{\\an8}<font color="#ffff00">') and texts[3].count("\n") == 1
    assert _untagged(texts[3]).replace("\n", " ") == plain_text(translations[2])
    assert texts[4].split("\n") == [f"- {plain_text(t)}" for t in translations[3:5]]
    assert texts[5] == "♪ ♪"


def test_vtt_translated_as_the_text_api_translates(translate_segments: SegmentTranslator) -> None:
    data = VTT.encode()
    extracted = VttFormat.extract(data, DocumentLimits())
    translations = translate_segments(extracted.segments, VttFormat)
    out = extracted.write(translations)
    text = out.decode()
    for block in (HEADER, NOTE, STYLE, REGION, "NOTE entre deux cues\n\n"):
        assert block in text
    before, after = _vtt_captions(data), _vtt_captions(out)
    assert [(c.identifier, c.start, c.end, c.settings) for c in after] == [
        (c.identifier, c.start, c.end, c.settings) for c in before
    ]
    assert "00:01.000 --> 00:02.500 align:start line:90% region:bas" in text
    first, second = (caption.raw_text for caption in after[:2])
    assert first.startswith("<v Roger>") and second.startswith("<v Roger>")
    assert f"{_untagged(first)} {_untagged(second)}" == plain_text(translations[0])
    assert "<b>black</b>" in after[2].raw_text
    assert after[3].raw_text.startswith("<c.jaune>") and "<00:09.000>" in after[3].raw_text
    assert after[3].text == _untagged(plain_text(translations[2]))


def test_vtt_text_escaped_again() -> None:
    extracted = VttFormat.extract(VTT.encode(), DocumentLimits())
    translations = [*extracted.segments[:2], "<s0>A woman </s0><p0/>sings &amp; dances &lt;3"]
    last = _vtt_captions(extracted.write(translations))[-1]
    assert last.raw_text == "<c.jaune>A woman</c> <00:09.000>sings &amp; dances &lt;3"


def test_split_back_in_proportion_and_never_empty() -> None:
    data = (
        b"1\n00:00:01,000 --> 00:00:02,000\nUn homme\n\n"
        b"2\n00:00:02,000 --> 00:00:05,000\nmarche dans la rue avec son chien noir\n\n"
        b"3\n00:00:05,000 --> 00:00:06,000\nce matin.\n"
    )
    extracted = SrtFormat.extract(data, DocumentLimits())
    assert len(extracted.segments) == 1
    words = "One two three four five six seven eight nine ten eleven twelve."
    texts = [cue.content for cue in _srt_cues(extracted.write([words]))]
    # 8, 38 and 9 source characters: the cuts nearest 8/55 and 46/55 of the translation.
    assert texts == ["One two", "three four five six seven eight nine ten eleven", "twelve."]
    texts = [cue.content for cue in _srt_cues(extracted.write(["Yes sir."]))]
    assert texts == ["Yes", "sir.", "…"]


def test_cue_lines_rewrapped_over_as_many_lines() -> None:
    data = (
        b"1\n00:00:01,000 --> 00:00:04,000\n"
        b"Une femme en robe rouge chante\ndans le parc avec ses amis.\n"
    )
    extracted = SrtFormat.extract(data, DocumentLimits())
    assert extracted.segments == ["Une femme en robe rouge chante dans le parc avec ses amis."]
    (cue,) = _srt_cues(extracted.write(["A woman in a red dress sings in the park with friends."]))
    assert cue.content == "A woman in a red dress sings\nin the park with friends."
    (cue,) = _srt_cues(extracted.write(["Hello."]))
    assert cue.content == "Hello."


def test_long_unpunctuated_runs_are_not_one_sentence() -> None:
    cues = "".join(
        f"{n}\n00:00:{n:02},000 --> 00:00:{n:02},900\nla la la un chien court\n\n"
        for n in range(1, 12)
    )
    segments = SrtFormat.extract(cues.encode(), DocumentLimits()).segments
    assert [segment.count("chien") for segment in segments] == [5, 5, 1]


@pytest.mark.parametrize(
    ("format", "data", "reason"),
    [
        (SrtFormat, SRT.replace("♪", "*").encode("cp1252"), "not UTF-8"),
        (SrtFormat, b"Un chien noir court dans l'herbe.\n", "not valid SRT"),
        (  # a cue's timing line broken: srt would read it as text of the cue before
            SrtFormat,
            b"1\n00:00:01,000 --> 00:00:02,000\nUn chat.\n\n2\nxx --> yy\nUn chien.\n",
            "the cue after cue 1 has a timing line that cannot be read",
        ),
        (  # hours past what a timedelta holds
            SrtFormat,
            b"1\n99999999999999999999:00:01,000 --> 99999999999999999999:00:02,000\nUn chat.\n",
            "not valid SRT",
        ),
        (VttFormat, b"WEBVTT\n\n00:01.000 --> 00:02.000\nUn chien\x00\n", "NUL"),
    ],
)
def test_refused(format: type[SrtFormat | VttFormat], data: bytes, reason: str) -> None:
    with pytest.raises(DocumentRefused, match=reason):
        format.extract(data, DocumentLimits())


def test_character_limit() -> None:
    with pytest.raises(DocumentRefused) as refused:
        SrtFormat.extract(SRT.encode(), DocumentLimits(max_characters=40))
    assert refused.value.status == 413
