"""XLIFF 1.2 and 2.x (2.0, 2.1, 2.2): each unit's source translated into its target.

XLIFF is the exchange format of translation tools (Okapi, memoQ, Trados, Weblate, Xcode): a
unit holds a source, and the tool that sent the file reads back the target we write. So the
file's own structure is kept as it is (unit ids, notes, groups, every attribute) and only
targets are written: created right after the source (XLIFF 1.2: after `<seg-source>` when
present, whose `<mrk mtype="seg">` segments are translated one by one), their content
replaced where the unit already has one.

A segment is the source's inner XML (see Fragments): inline markup the tool keeps (`<g>`,
`<x/>`, `<bx/>`, `<ex/>`, `<mrk>`; 2.x `<pc>`, `<ph/>`, `<sc/>`, `<ec/>`, `<mrk>`, `<cp/>`) is
carried by the markup layer to the target words aligned to what it wrapped, and written back
in the XLIFF namespace. Units the file marks `translate="no"` (on the unit or an enclosing
group or file) get no target.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from lxml import etree

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.safety import parse_xml, xml_bytes

XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"  # 2.1 and 2.2 keep the 2.0 namespace
XML_NS = "http://www.w3.org/XML/1998/namespace"

# What a segment holds in place of markup the layer must not read or take apart (see
# Fragments): a point, and a span standing for an opening and a closing code.
CODE = "nmt-code"
PAIR = "nmt-pair"
_WRAPPER = "nmt-fragment"

# XLIFF 1.2 inline elements whose content is the native code they stand for (`<bpt
# id="1">&lt;b&gt;</bpt>`): not text to translate, copied as they are.
NATIVE_CODES_1 = frozenset({"ph", "bpt", "ept", "it"})


@dataclass(frozen=True)
class Pairing:
    """An opening code and the closing code that ends it, side by side in one parent: the
    words between them are what they format, so the pair travels as one span."""

    opener: str
    closer: str
    matches: Callable[[etree._Element, etree._Element], bool]


def _same_rid_or_id(opener: etree._Element, closer: etree._Element) -> bool:
    """XLIFF 1.2 links `<bpt>` to `<ept>` (and `<bx/>` to `<ex/>`) by rid, or else by id."""
    if opener.get("rid") is not None and closer.get("rid") is not None:
        return opener.get("rid") == closer.get("rid")
    return opener.get("id") is not None and opener.get("id") == closer.get("id")


def _start_ref(opener: etree._Element, closer: etree._Element) -> bool:
    """XLIFF 2.x: `<ec startRef="1"/>` ends `<sc id="1"/>` (and `<em/>` ends `<sm/>`)."""
    return opener.get("id") is not None and closer.get("startRef") == opener.get("id")


PAIRINGS_1 = (Pairing("bpt", "ept", _same_rid_or_id), Pairing("bx", "ex", _same_rid_or_id))
PAIRINGS_2 = (Pairing("sc", "ec", _start_ref), Pairing("sm", "em", _start_ref))


class Fragments:
    """The inline content of one XML vocabulary as segments hold it, and back.

    The markup layer reads a segment with expat and no namespace processing, so an element of
    the vocabulary (`namespace`) is written by its plain name (`<g id="1">`) and read back in
    the namespace; an attribute of another namespace keeps its prefix and brings its
    declaration (`its:locNote="..." xmlns:its="..."`), so that a segment reads alike with
    namespace processing (ElementTree) and without. What the layer must not read or move
    apart is kept here and stands in the segment as `<nmt-code n="3"/>`, a point: native code
    (`codes`), elements of other vocabularies, comments, processing instructions, entity
    references. An opening and a closing code side by side (`pairings`) stand as
    `<nmt-pair n="4">...</nmt-pair>`, a span, so that they stay around the translation of the
    words between them. Elements named in `silent` hold no prose (script, style): their text
    is not counted.

    One Fragments serves one reading of one file: `n` numbers what it keeps."""

    def __init__(
        self,
        namespace: str | None,
        codes: frozenset[str] = frozenset(),
        pairings: tuple[Pairing, ...] = (),
        silent: frozenset[str] = frozenset(),
    ) -> None:
        self.namespace = namespace
        self.codes = codes
        self.pairings = pairings
        self.silent = silent
        self.kept: list[etree._Element] = []
        self.pairs: list[tuple[etree._Element, etree._Element]] = []

    # --- tree -> segment ---------------------------------------------------------------

    def markup(self, lead: str | None, nodes: list[etree._Element]) -> tuple[str, str]:
        """The segment for `lead` text followed by `nodes` (each with its tail), and the
        text it holds (what the model reads, for the character count)."""
        out: list[str] = []
        text: list[str] = []
        self._nodes(lead, nodes, out, text)
        return "".join(out), "".join(text)

    def content(self, element: etree._Element) -> tuple[str, str]:
        """The element's inner content as a segment, and its text."""
        return self.markup(element.text, list(element))

    def _nodes(
        self, lead: str | None, nodes: list[etree._Element], out: list[str], text: list[str] | None
    ) -> None:
        self._text(lead, out, text)
        at = 0
        while at < len(nodes):
            node = nodes[at]
            closer = self._closer(nodes, at)
            if closer is not None:
                out.append(f'<{PAIR} n="{len(self.pairs)}">')
                self.pairs.append((_kept(node), _kept(nodes[closer])))
                self._nodes(node.tail, nodes[at + 1 : closer], out, text)
                out.append(f"</{PAIR}>")
                self._text(nodes[closer].tail, out, text)
                at = closer + 1
                continue
            self._node(node, out, text)
            self._text(node.tail, out, text)
            at += 1

    def _node(self, node: etree._Element, out: list[str], text: list[str] | None) -> None:
        name = self._plain_name(node)
        attributes = self._attributes(node) if name is not None else None
        if name is None or attributes is None:
            out.append(f'<{CODE} n="{len(self.kept)}"/>')
            self.kept.append(_kept(node))
            return
        if node.text is None and len(node) == 0:
            out.append(f"<{name}{attributes}/>")
            return
        out.append(f"<{name}{attributes}>")
        self._nodes(node.text, list(node), out, None if name in self.silent else text)
        out.append(f"</{name}>")

    def _closer(self, nodes: list[etree._Element], at: int) -> int | None:
        """Where the closing code of the opening code nodes[at] stands among its siblings."""
        name = self._local_name(nodes[at])
        for pairing in self.pairings:
            if name != pairing.opener:
                continue
            for later in range(at + 1, len(nodes)):
                if self._local_name(nodes[later]) == pairing.closer and pairing.matches(
                    nodes[at], nodes[later]
                ):
                    return later
        return None

    def _plain_name(self, node: etree._Element) -> str | None:
        """The element's name in the segment; None for what is kept as a code."""
        name = self._local_name(node)
        return name if name not in self.codes else None

    def _local_name(self, node: etree._Element) -> str | None:
        """The element's name in the vocabulary; None for what is not of it."""
        if not isinstance(node.tag, str):  # a comment, processing instruction, entity
            return None
        name = etree.QName(node)
        return name.localname if name.namespace == self.namespace else None

    def _attributes(self, node: etree._Element) -> str | None:
        """The attributes as written in the segment; None when one cannot be written. An
        attribute of another namespace comes with the declaration of its prefix, so that the
        segment reads alike with and without namespace processing."""
        written: list[str] = []
        declared: dict[str, str] = {}
        for key, value in node.attrib.items():
            name = etree.QName(key)
            if name.namespace is None:
                label = name.localname
            elif name.namespace == XML_NS:
                label = f"xml:{name.localname}"
            else:
                prefix = next(
                    (p for p, uri in node.nsmap.items() if p and uri == name.namespace), None
                )
                if prefix is None:
                    return None
                declared[prefix] = name.namespace
                label = f"{prefix}:{name.localname}"
            written.append(f" {label}={quoteattr(value, _ATTRIBUTE_WHITESPACE)}")
        written += [f" xmlns:{prefix}={quoteattr(uri)}" for prefix, uri in declared.items()]
        return "".join(written)

    @staticmethod
    def _text(value: str | None, out: list[str], text: list[str] | None) -> None:
        if value:
            out.append(escape(value))
            if text is not None:
                text.append(value)

    # --- translated segment -> tree ------------------------------------------------------

    def parse(self, translated: str) -> etree._Element:
        """The translated segment read under a wrapper element in the vocabulary's namespace,
        every code and pair put back as it was in the source."""
        default = f" xmlns={quoteattr(self.namespace)}" if self.namespace else ""
        wrapper = parse_xml(
            f"<{_WRAPPER}{default}>{translated}</{_WRAPPER}>".encode(),
            "a translated segment",
        )
        code, pair = self._tag(CODE), self._tag(PAIR)
        for holder in list(wrapper.iter(code, pair)):
            index = int(holder.attrib["n"])
            parent = holder.getparent()
            if holder.tag == code:
                kept = deepcopy(self.kept[index])
                kept.tail = holder.tail
                parent.replace(holder, kept)
                continue
            opener, closer = (deepcopy(element) for element in self.pairs[index])
            opener.tail, closer.tail = holder.text, holder.tail
            at = parent.index(holder)
            parent[at : at + 1] = [opener, *holder, closer]
        return wrapper

    def fill(self, element: etree._Element, translated: str) -> None:
        """The element's content replaced by the translated segment."""
        wrapper = self.parse(translated)
        element[:] = list(wrapper)
        element.text = wrapper.text

    def splice(
        self,
        parent: etree._Element,
        after: etree._Element | None,
        before: etree._Element | None,
        translated: str,
    ) -> None:
        """The stretch of parent's content between child `after` (None: from the start) and
        child `before` (None: to the end) replaced by the translated segment."""
        wrapper = self.parse(translated)
        start = 0 if after is None else parent.index(after) + 1
        end = len(parent) if before is None else parent.index(before)
        if after is None:
            parent.text = wrapper.text
        else:
            after.tail = wrapper.text
        parent[start:end] = list(wrapper)

    def _tag(self, name: str) -> str:
        return f"{{{self.namespace}}}{name}" if self.namespace else name


# Whitespace in an attribute value kept as references, so that expat does not read it as
# spaces (attribute value normalization) before the value is written back.
_ATTRIBUTE_WHITESPACE = {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}


def _kept(node: etree._Element) -> etree._Element:
    copy = deepcopy(node)
    copy.tail = None
    return copy


def check_characters(characters: int, limits: DocumentLimits) -> None:
    """DocumentRefused (413) for a file with more text to translate than the limit allows."""
    if characters > limits.max_characters:
        raise DocumentRefused(
            f"the file holds more than {limits.max_characters} characters of text "
            "(NMT_MAX_DOCUMENT_CHARACTERS)",
            413,
        )


# --- sniffing ----------------------------------------------------------------------------

_PROLOG = re.compile(
    r"\s+|<\?.*?\?>|<!--.*?-->|<!DOCTYPE(?:[^\[>]*\[.*?\]\s*>|[^>]*>)", re.DOTALL | re.IGNORECASE
)
_NAME = re.compile(r"<([A-Za-z_][\w.:-]*)")


def root_name(data: bytes, head: int = 1 << 20) -> str | None:
    """The local name of the first element, read from the start of the file past the XML
    declaration, comments and a document type declaration, without parsing anything."""
    text = _head_text(data[:head])
    at = 0
    while match := _PROLOG.match(text, at):
        at = match.end()
    found = _NAME.match(text, at)
    return found.group(1).rpartition(":")[2] if found else None


def _head_text(head: bytes) -> str:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        codec = "utf-16-le" if head.startswith(b"\xff\xfe") else "utf-16-be"
        return head[2 : len(head) - len(head) % 2].decode(codec, errors="replace")
    return head.removeprefix(b"\xef\xbb\xbf").decode("latin-1")


# --- XLIFF -------------------------------------------------------------------------------


class XliffFormat(DocumentFormat):
    name = "xliff"
    extensions = (".xlf", ".xliff")
    media_type = "application/xliff+xml"

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        return root_name(data) == "xliff"

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> XliffDocument:
        reading = _Reading(data)
        check_characters(reading.characters, limits)
        return XliffDocument(data, reading.segments)


class XliffDocument(Extracted):
    """An XLIFF file read. `target_language` (set by the caller before write(): the file
    cannot say it) goes into `<file target-language>` (1.2) or `<xliff trgLang>` (2.x)."""

    def __init__(self, data: bytes, segments: list[str]) -> None:
        self.data = data
        self.segments = segments
        self.target_language: str | None = None

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        reading = _Reading(self.data)  # a fresh tree: write() may be called more than once
        return reading.write(translations, self.target_language)


class _Reading:
    """One reading of the file: its tree, its segments, and for each unit how to write its
    target from the translations of its segments."""

    def __init__(self, data: bytes) -> None:
        self.root = parse_xml(data, "the XLIFF file")
        name = etree.QName(self.root)
        if name.localname != "xliff":
            raise DocumentRefused(f"the file's root element is <{name.localname}>, not <xliff>")
        self.namespace = name.namespace
        self.version = 2 if (self.root.get("version") or "").startswith("2") else 1
        if name.namespace == XLIFF_2:
            self.version = 2
        self.fragments = (
            Fragments(self.namespace, pairings=PAIRINGS_2)
            if self.version == 2
            else Fragments(self.namespace, codes=NATIVE_CODES_1, pairings=PAIRINGS_1)
        )
        self.segments: list[str] = []
        self.characters = 0
        # (how many segments, what writes them) for each unit, in document order
        self.writers: list[tuple[int, Callable[[list[str]], None]]] = []
        if self.version == 2:
            self._read_2()
        else:
            self._read_1()

    def _q(self, name: str) -> str:
        return f"{{{self.namespace}}}{name}" if self.namespace else name

    def _add(self, pieces: list[tuple[str, str]], writer: Callable[[list[str]], None]) -> None:
        if not any(text.strip() for _, text in pieces):
            return  # nothing to translate: no target is written
        self.segments += [markup for markup, _ in pieces]
        self.characters += sum(len(text) for _, text in pieces)
        self.writers.append((len(pieces), writer))

    # --- 1.2 ---

    def _read_1(self) -> None:
        for unit in self.root.iter(self._q("trans-unit")):
            source = unit.find(self._q("source"))
            if source is None or not _translatable(unit):
                continue
            seg_source = unit.find(self._q("seg-source"))
            marks = self._marks(seg_source) if seg_source is not None else []
            if marks:
                pieces = [self.fragments.content(mark) for mark in marks]
                self._add(pieces, lambda done, u=unit, s=seg_source: self._write_marks(u, s, done))
            else:
                pieces = [self.fragments.content(source)]
                self._add(pieces, lambda done, u=unit, s=source: self._write_unit_1(u, s, done[0]))

    def _marks(self, element: etree._Element) -> list[etree._Element]:
        return [mark for mark in element.iter(self._q("mrk")) if mark.get("mtype") == "seg"]

    def _write_unit_1(self, unit: etree._Element, source: etree._Element, done: str) -> None:
        self.fragments.fill(self._target_1(unit, source), done)

    def _write_marks(
        self, unit: etree._Element, seg_source: etree._Element, done: list[str]
    ) -> None:
        """The target as a copy of <seg-source>, each segment's <mrk> holding its translation
        (what lies between segments is copied as it is)."""
        target = self._target_1(unit, seg_source)
        copy = deepcopy(seg_source)
        target[:] = list(copy)
        target.text = copy.text
        for mark, translated in zip(self._marks(target), done, strict=True):
            self.fragments.fill(mark, translated)

    def _target_1(self, unit: etree._Element, after: etree._Element) -> etree._Element:
        """The unit's target, emptied, or a new one right after the source (or seg-source);
        marked translated by machine translation (see _mark_state_1)."""
        target = unit.find(self._q("target"))
        if target is None:
            target = etree.Element(self._q("target"))
            _insert_after(after, target)
        target[:] = []
        target.text = None
        _mark_state_1(target)
        return target

    # --- 2.x ---

    def _read_2(self) -> None:
        for unit in self.root.iter(self._q("unit")):
            if not _translatable(unit):
                continue
            for segment in unit.findall(self._q("segment")):  # <ignorable> stays as it is
                source = segment.find(self._q("source"))
                if source is None:
                    continue
                self._add(
                    [self.fragments.content(source)],
                    lambda done, s=segment, src=source: self._write_segment_2(s, src, done[0]),
                )

    def _write_segment_2(self, segment: etree._Element, source: etree._Element, done: str) -> None:
        target = segment.find(self._q("target"))
        if target is None:
            target = etree.Element(self._q("target"))
            _insert_after(source, target)
        self.fragments.fill(target, done)
        # 2.x states: initial, translated, reviewed, final. A machine translation is
        # translated, not reviewed; a subState said something of the old target: dropped.
        segment.set("state", "translated")
        segment.attrib.pop("subState", None)

    # --- writing ---

    def write(self, translations: list[str], language: str | None) -> bytes:
        done = iter(translations)
        for count, writer in self.writers:
            writer([next(done) for _ in range(count)])
        if language:
            self._set_language(language)
        return xml_bytes(self.root)

    def _set_language(self, language: str) -> None:
        xml_lang = f"{{{XML_NS}}}lang"
        if self.version == 2:
            self.root.set("trgLang", language)
        else:
            for file in self.root.iter(self._q("file")):
                file.set("target-language", language)
        # A target's own language, where it names one, must agree (alt-trans proposals
        # keep theirs).
        holders = {self._q("trans-unit"), self._q("segment")}
        for target in self.root.iter(self._q("target")):
            if target.getparent().tag in holders and target.get(xml_lang) is not None:
                target.set(xml_lang, language)


def _insert_after(element: etree._Element, new: etree._Element) -> None:
    """`new` as the next sibling of `element`, on a line of its own indented as element is
    when the file is indented (so a target sits under its source)."""
    previous = element.getprevious()
    indent = element.getparent().text if previous is None else previous.tail
    new.tail = element.tail
    element.addnext(new)
    if indent is not None and not indent.strip():
        element.tail = indent


def _mark_state_1(target: etree._Element) -> None:
    """XLIFF 1.2: state "translated" with state-qualifier "leveraged-mt" ("derived from a
    machine translation output"). Tools (Okapi, Weblate, memoQ) count a translated unit as
    done and show the qualifier to reviewers; "needs-review-translation" would flag every
    unit of the file for review, which is the reviewer's call, not the machine's."""
    target.set("state", "translated")
    target.set("state-qualifier", "leveraged-mt")


def _translatable(element: etree._Element) -> bool:
    """translate="no" on the unit or the nearest group or file that says either way."""
    for node in (element, *element.iterancestors()):
        value = node.get("translate")
        if value is not None:
            return value.strip().lower() != "no"
    return True
