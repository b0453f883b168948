"""XLIFF 1.2 and 2.x: targets written for every translatable unit, as the text API translates
its source, inline codes kept around the words they wrapped; the file read by lxml afterwards;
hostile XML refused before anything is read."""

from __future__ import annotations

import codecs
import itertools
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree
from xml.parsers import expat

import pytest
from lxml import etree

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.html import HtmlFormat
from service.documents.formats.safety import parse_xml
from service.documents.formats.xliff import XLIFF_1, XLIFF_2, XliffFormat
from tests.documents.conftest import SegmentTranslator

X1 = f"{{{XLIFF_1}}}"
X2 = f"{{{XLIFF_2}}}"

XLIFF_12 = f"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="{XLIFF_1}" xmlns:its="http://www.w3.org/2005/11/its">
  <file original="story.txt" source-language="fr" datatype="plaintext">
    <header><note>Made by hand.</note></header>
    <body>
      <trans-unit id="dog">
        <source>Un chien <g id="1" ctype="bold" its:locNote="adjectif">noir</g> court dans l'herbe.</source>
      </trans-unit>
      <trans-unit id="guitar">
        <source>Un homme <x id="2" ctype="x-tab"/> joue de la guitare.</source>
        <target state="new">Vieille traduction</target>
        <note>the target is replaced</note>
      </trans-unit>
      <trans-unit id="dress">
        <source>Une femme en robe <bpt id="3">&lt;b&gt;</bpt>rouge<ept id="3">&lt;/b&gt;</ept> marche dans la rue.</source>
      </trans-unit>
      <trans-unit id="park">
        <source>Deux enfants jouent au football <ph id="4">&lt;br/&gt;</ph> dans le parc.</source>
      </trans-unit>
      <group id="legal" translate="no">
        <trans-unit id="kept"><source>Ne pas traduire.</source></trans-unit>
      </group>
      <trans-unit id="code" translate="no"><source>Un chat dort.</source></trans-unit>
      <trans-unit id="segmented">
        <source>Un chat dort. Un homme est assis sur un banc.</source>
        <seg-source><mrk mtype="seg" mid="1">Un chat dort.</mrk> <mrk mtype="seg" mid="2">Un homme est assis sur un banc.</mrk></seg-source>
      </trans-unit>
      <trans-unit id="empty"><source> <x id="9"/> </source></trans-unit>
    </body>
  </file>
</xliff>
"""  # noqa: E501

XLIFF_21 = f"""<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="{XLIFF_2}" version="2.1" srcLang="fr">
  <file id="f1">
    <notes><note>A story.</note></notes>
    <unit id="boy">
      <segment>
        <source>Un garçon <pc id="1" dataRefStart="d1" dataRefEnd="d2">saute</pc> dans l'eau.</source>
      </segment>
      <segment state="final">
        <source>Une femme en robe <sc id="2" dataRef="d3"/>rouge<ec startRef="2" dataRef="d4"/> marche dans la rue.</source>
        <target>Ancienne traduction</target>
      </segment>
      <ignorable><source> </source></ignorable>
    </unit>
    <unit id="girl">
      <segment>
        <source>Une fille <mrk id="m1" translate="no">Adidas</mrk> court.</source>
      </segment>
    </unit>
    <unit id="bench">
      <segment><source>Un homme <ph id="3" dataRef="d5"/> est assis sur un banc<cp hex="E000"/>.</source></segment>
    </unit>
    <group id="g" translate="no">
      <unit id="kept"><segment><source>Ne pas traduire.</source></segment></unit>
    </group>
  </file>
</xliff>
"""  # noqa: E501


def extract(text: str, limits: DocumentLimits | None = None):
    return XliffFormat.extract(text.encode(), limits or DocumentLimits())


def inline_elements(element: etree._Element) -> Counter:
    """The inline elements inside a source or target: name and attributes (each once)."""
    return Counter(
        (etree.QName(e).localname, tuple(sorted(e.attrib.items())))
        for e in element.iterdescendants()
        if isinstance(e.tag, str)
    )


def prose(element: etree._Element, native_codes: frozenset[str] = frozenset()) -> str:
    """The element's text, without what native code elements hold."""
    parts = [element.text or ""]
    for child in element:
        if not isinstance(child.tag, str) or etree.QName(child).localname not in native_codes:
            parts.append(prose(child, native_codes))
        parts.append(child.tail or "")
    return "".join(parts)


def plain(segment: str) -> str:
    return "".join(etree.fromstring(f"<s>{segment}</s>").itertext())


# --- reading -----------------------------------------------------------------------------


def test_sniff_is_judged_from_content() -> None:
    assert XliffFormat.sniff(XLIFF_12.encode())
    assert XliffFormat.sniff(XLIFF_21.encode())
    assert XliffFormat.sniff(XLIFF_12.encode("utf-16"))  # with its byte order mark
    assert not XliffFormat.sniff(b"<?xml version='1.0'?><html><p>Un chat.</p></html>")
    assert not XliffFormat.sniff(b"Un chat dort. <xliff> in a sentence")
    assert not HtmlFormat.sniff(XLIFF_12.encode())


def test_12_segments_are_the_sources_inner_markup() -> None:
    extracted = extract(XLIFF_12)
    assert extracted.segments == [
        'Un chien <g id="1" ctype="bold" its:locNote="adjectif"'
        ' xmlns:its="http://www.w3.org/2005/11/its">noir</g> court dans l\'herbe.',
        'Un homme <x id="2" ctype="x-tab"/> joue de la guitare.',
        # bpt/ept hold native code: a span stands for the pair, their content is not text
        'Une femme en robe <nmt-pair n="0">rouge</nmt-pair> marche dans la rue.',
        'Deux enfants jouent au football <nmt-code n="0"/> dans le parc.',
        "Un chat dort.",  # translate="no" units (and groups) are skipped; mrk segments are not
        "Un homme est assis sur un banc.",
    ]


def test_segments_read_with_and_without_namespace_processing() -> None:
    """The markup layer reads segments with expat and no namespaces; ElementTree (what
    counts their characters) processes namespaces: both read every segment."""
    for text in (XLIFF_12, XLIFF_21):
        for segment in extract(text).segments:
            ElementTree.fromstring(f"<s>{segment}</s>")
            expat.ParserCreate().Parse(f"<s>{segment}</s>", True)


def test_21_segments() -> None:
    assert extract(XLIFF_21).segments == [
        'Un garçon <pc id="1" dataRefStart="d1" dataRefEnd="d2">saute</pc> dans l\'eau.',
        'Une femme en robe <nmt-pair n="0">rouge</nmt-pair> marche dans la rue.',
        'Une fille <mrk id="m1" translate="no">Adidas</mrk> court.',
        'Un homme <ph id="3" dataRef="d5"/> est assis sur un banc<cp hex="E000"/>.',
    ]


# --- translating ---------------------------------------------------------------------------


def test_12_translated_as_the_text_api_translates_each_segment(
    translate_segments: SegmentTranslator,
) -> None:
    extracted = extract(XLIFF_12)
    translations = translate_segments(extracted.segments, XliffFormat)
    extracted.target_language = "en"
    root = etree.fromstring(extracted.write(translations))  # lxml reads it

    source = etree.fromstring(XLIFF_12.encode())
    units = {u.get("id"): u for u in root.iter(f"{X1}trans-unit")}
    assert list(units) == [u.get("id") for u in source.iter(f"{X1}trans-unit")]
    assert root.find(f"{X1}file").get("target-language") == "en"
    assert root.find(f"{X1}file").get("source-language") == "fr"
    assert root.find(f".//{X1}header/{X1}note").text == "Made by hand."

    native = frozenset({"bpt", "ept", "ph"})
    translated = ["dog", "guitar", "dress", "park"]
    for unit_id, translation in zip(translated, translations, strict=False):
        unit = units[unit_id]
        src, target = unit.find(f"{X1}source"), unit.find(f"{X1}target")
        assert target is not None and unit.index(target) == unit.index(src) + 1
        assert target.get("state") == "translated"
        assert target.get("state-qualifier") == "leveraged-mt"
        assert inline_elements(target) == inline_elements(src)  # names, attributes, counts
        assert prose(target, native) == plain(translation)
        assert prose(target, native) != prose(src, native)
    # Native code is copied as it was.
    dress = units["dress"].find(f"{X1}target")
    assert [e.text for e in dress] == ["<b>", "</b>"]
    # The target that was there is replaced, not added to; the note stays after it.
    guitar = units["guitar"]
    assert len(guitar.findall(f"{X1}target")) == 1
    assert [etree.QName(c).localname for c in guitar] == ["source", "target", "note"]
    # Untranslatable and empty units get no target.
    for unit_id in ("kept", "code", "empty"):
        assert units[unit_id].find(f"{X1}target") is None
    # seg-source: the target mirrors it, each <mrk> holding its segment's translation.
    segmented = units["segmented"]
    marks = segmented.find(f"{X1}target").findall(f"{X1}mrk")
    assert [m.get("mid") for m in marks] == ["1", "2"]
    assert [m.text for m in marks] == translations[4:6]
    assert [c.tag for c in segmented] == [f"{X1}{n}" for n in ("source", "seg-source", "target")]


def test_12_formatted_word_lands_on_its_translation(translate_segments: SegmentTranslator) -> None:
    extracted = extract(XLIFF_12)
    root = etree.fromstring(extracted.write(translate_segments(extracted.segments, XliffFormat)))
    dog = root.find(f".//{X1}trans-unit[@id='dog']/{X1}target")
    assert dog.find(f"{X1}g").text == "black"
    assert dog.find(f"{X1}g").get("{http://www.w3.org/2005/11/its}locNote") == "adjectif"
    dress = root.find(f".//{X1}trans-unit[@id='dress']/{X1}target")
    bpt, ept = dress.find(f"{X1}bpt"), dress.find(f"{X1}ept")
    assert bpt.tail == "red"  # the pair stays around the translated word
    assert bpt.getnext() is ept


def test_21_translated_as_the_text_api_translates_each_segment(
    translate_segments: SegmentTranslator,
) -> None:
    extracted = extract(XLIFF_21)
    translations = translate_segments(extracted.segments, XliffFormat)
    extracted.target_language = "en"
    root = etree.fromstring(extracted.write(translations))

    assert root.get("srcLang") == "fr" and root.get("trgLang") == "en"
    source = etree.fromstring(XLIFF_21.encode())
    assert [u.get("id") for u in root.iter(f"{X2}unit")] == [
        u.get("id") for u in source.iter(f"{X2}unit")
    ]
    segments = [s for s in root.iter(f"{X2}segment") if s.getparent().get("id") != "kept"]
    assert len(segments) == len(translations)
    for segment, translation in zip(segments, translations, strict=True):
        src, targets = segment.find(f"{X2}source"), segment.findall(f"{X2}target")
        assert len(targets) == 1 and segment.index(targets[0]) == segment.index(src) + 1
        assert segment.get("state") == "translated"
        assert inline_elements(targets[0]) == inline_elements(src)
        assert prose(targets[0]) == plain(translation) != prose(src)
    boy = segments[0].find(f"{X2}target")
    assert boy.find(f"{X2}pc").text == "jumps"
    dress = segments[1].find(f"{X2}target")
    assert dress.find(f"{X2}sc").tail == "red"
    girl = segments[2].find(f"{X2}target")
    assert girl.find(f"{X2}mrk").text == "Adidas"  # translate="no": as it was
    assert root.find(f".//{X2}unit[@id='kept']//{X2}target") is None
    assert root.find(f".//{X2}ignorable/{X2}target") is None


@pytest.mark.parametrize("text", [XLIFF_12, XLIFF_21], ids=["1.2", "2.1"])
def test_identity_round_trip(text: str) -> None:
    """Translations equal to the segments: each target is its source, byte for byte."""
    extracted = extract(text)
    root = etree.fromstring(extracted.write(extracted.segments))
    namespace = etree.QName(root).namespace
    for target in root.iter(f"{{{namespace}}}target"):
        holder = target.getparent()
        source = holder.find(f"{{{namespace}}}seg-source")
        if source is None:
            source = holder.find(f"{{{namespace}}}source")
        assert inner(target) == inner(source)
    # and the rest of the file is the same tree, targets apart
    assert without_targets(root) == without_targets(etree.fromstring(text.encode()))


def without_targets(root: etree._Element) -> bytes:
    """The tree without targets, the states that speak of them, and indentation."""
    namespace = etree.QName(root).namespace
    for target in list(root.iter(f"{{{namespace}}}target")):
        target.getparent().remove(target)
    for segment in root.iter(f"{{{namespace}}}segment"):
        segment.attrib.pop("state", None)
    for element in root.iter():
        if element.text is not None and not element.text.strip():
            element.text = None
        if element.tail is not None and not element.tail.strip():
            element.tail = None
    return etree.tostring(root, method="c14n")


def inner(element: etree._Element) -> bytes:
    return (element.text or "").encode() + b"".join(
        etree.tostring(child, method="c14n") for child in element
    )


def test_target_language_unset_leaves_the_file_saying_none() -> None:
    extracted = extract(XLIFF_12)
    root = etree.fromstring(extracted.write(extracted.segments))
    assert root.find(f"{X1}file").get("target-language") is None


def test_utf16_file_is_read_and_written_back() -> None:
    data = XLIFF_12.replace('encoding="UTF-8"', 'encoding="UTF-16"').encode("utf-16")
    extracted = XliffFormat.extract(data, DocumentLimits())
    assert extracted.segments == extract(XLIFF_12).segments
    out = extracted.write(extracted.segments)
    assert out.startswith(b"\xff\xfe") or out.startswith(b"\xfe\xff")
    assert etree.fromstring(out).find(f".//{X1}target") is not None


def test_unit_without_namespace_is_read() -> None:
    """Old 1.x tools write <xliff version="1.2"> without the namespace."""
    text = XLIFF_12.replace(f' xmlns="{XLIFF_1}"', "")
    extracted = extract(text)
    assert extracted.segments == extract(XLIFF_12).segments
    root = etree.fromstring(extracted.write(extracted.segments))
    assert root.find(".//trans-unit[@id='dog']/target/g").text == "noir"


# --- refused -----------------------------------------------------------------------------


def test_more_text_than_the_limit_is_refused() -> None:
    with pytest.raises(DocumentRefused) as refused:
        extract(XLIFF_12, DocumentLimits(max_characters=50))
    assert refused.value.status == 413


BILLION_LAUGHS = f"""<?xml version="1.0"?>
<!DOCTYPE xliff [
  <!ENTITY lol "lol">
  <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
  <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
  <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
  <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
  <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
  <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<xliff version="1.2" xmlns="{XLIFF_1}"><file original="a" source-language="fr" datatype="x">
<body><trans-unit id="1"><source>&lol9;</source></trans-unit></body></file></xliff>
"""


def test_billion_laughs_is_refused() -> None:
    data = BILLION_LAUGHS.encode()
    assert XliffFormat.sniff(data)  # it is an XLIFF file: the refusal names what is wrong
    with pytest.raises(DocumentRefused, match="entities") as refused:
        XliffFormat.extract(data, DocumentLimits())
    assert refused.value.status == 400


def test_external_entity_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret")
    # In UTF-16 too, where the declaration is not ASCII bytes.
    encodings = (
        (b"", "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be"),
    )
    for system, (bom, encoding) in itertools.product(
        ("file:///etc/passwd", secret.as_uri()), encodings
    ):
        declared = "UTF-16" if bom else "UTF-8"
        data = bom + (
            f'<?xml version="1.0" encoding="{declared}"?>\n'
            f'<!DOCTYPE xliff [<!ENTITY xxe SYSTEM "{system}">]>\n'
            f'<xliff version="1.2" xmlns="{XLIFF_1}"><file original="a" source-language="fr" '
            'datatype="x"><body><trans-unit id="1"><source>&xxe;</source></trans-unit></body>'
            "</file></xliff>"
        ).encode(encoding)
        assert XliffFormat.sniff(data)
        with pytest.raises(DocumentRefused, match="entities") as refused:
            XliffFormat.extract(data, DocumentLimits())
        assert "secret" not in str(refused.value) and "root:" not in str(refused.value)


def test_external_dtd_is_never_loaded(tmp_path: Path) -> None:
    """A DOCTYPE without a subset declares nothing itself, and its DTD is not read: the entity
    it would define stays an unexpanded reference, kept as it is (a code, not text)."""
    dtd = tmp_path / "evil.dtd"
    dtd.write_text('<!ENTITY stolen "the secret">')
    data = (
        f'<?xml version="1.0"?>\n<!DOCTYPE xliff SYSTEM "{dtd.as_uri()}">\n'
        f'<xliff version="1.2" xmlns="{XLIFF_1}"><file original="a" source-language="fr" '
        'datatype="x"><body><trans-unit id="1"><source>Un chat &stolen;</source></trans-unit>'
        "</body></file></xliff>"
    ).encode()
    assert parse_xml(data, "test").getroottree().docinfo.externalDTD is None
    extracted = XliffFormat.extract(data, DocumentLimits())
    assert extracted.segments == ['Un chat <nmt-code n="0"/>']
    out = extracted.write(['A cat <nmt-code n="0"/>'])
    assert b"<target" in out and b"A cat &stolen;" in out and b"secret" not in out


def test_not_xliff_is_refused() -> None:
    with pytest.raises(DocumentRefused, match="not <xliff>"):
        XliffFormat.extract(b"<?xml version='1.0'?><tmx><body/></tmx>", DocumentLimits())
    with pytest.raises(DocumentRefused, match="well-formed"):
        XliffFormat.extract(b"<xliff><file>", DocumentLimits())
