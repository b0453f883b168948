"""A paragraph's runs as one segment of inline markup, and back.

Office formats hold a paragraph as runs, each with its own formatting: "Le chat **noir**
dort." is three runs. The model must read the paragraph as one sentence, and the bold run must
land on "black" in "The black cat sleeps.". So the paragraph becomes one segment in which the
formatting that holds most of its characters is plain text and every other formatting is a
span: `Le chat <s1>noir</s1> dort.`; what holds no text (a tab, a line break, a picture, a
footnote mark) is a point `<p0/>`. The markup layer places spans and points by alignment; the
adapter reads the translation back as pieces and writes one run per piece.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from xml.etree import ElementTree
from xml.sax.saxutils import escape


@dataclass(frozen=True)
class Piece:
    """A stretch of translated text in one formatting (`style`: an index into
    Paragraph.styles), or a point (`point`: an index into Paragraph.points, text empty)."""

    text: str
    style: int
    point: int | None = None


@dataclass
class Paragraph:
    """Builds one segment: add the runs' text and points in reading order, then markup()."""

    styles: list[Hashable] = field(default_factory=list)  # distinct formattings, first seen first
    points: list[object] = field(default_factory=list)  # whatever the adapter keeps for each
    _pieces: list[Piece] = field(default_factory=list)

    def text(self, text: str, style: Hashable) -> None:
        if not text:
            return
        index = self._style(style)
        if self._pieces and self._pieces[-1].point is None and self._pieces[-1].style == index:
            last = self._pieces.pop()  # two runs alike are one span (Word splits runs often)
            text = last.text + text
        self._pieces.append(Piece(text, index))

    def point(self, kept: object, style: Hashable) -> None:
        self.points.append(kept)
        self._pieces.append(Piece("", self._style(style), len(self.points) - 1))

    @property
    def has_text(self) -> bool:
        return any(piece.text.strip() for piece in self._pieces)

    @property
    def base(self) -> int:
        """The style of most characters: the one written without a span."""
        sizes = [0] * len(self.styles)
        for piece in self._pieces:
            sizes[piece.style] += len(piece.text)
        return max(range(len(sizes)), key=sizes.__getitem__) if sizes else 0

    def markup(self) -> str:
        base = self.base
        out: list[str] = []
        for piece in self._pieces:
            if piece.point is not None:
                out.append(f"<p{piece.point}/>")
            elif piece.style == base:
                out.append(escape(piece.text))
            else:
                out.append(f"<s{piece.style}>{escape(piece.text)}</s{piece.style}>")
        return "".join(out)

    def read_back(self, translated: str) -> list[Piece]:
        """The translated segment as pieces, in order: text outside spans in the base style.
        Spans never nest here (markup() writes none), and the markup layer keeps them so."""
        root = ElementTree.fromstring(f"<segment>{translated}</segment>")
        base = self.base
        pieces: list[Piece] = []

        def add_text(text: str | None, style: int) -> None:
            if text:
                pieces.append(Piece(text, style))

        add_text(root.text, base)
        for child in root:
            kind, index = child.tag[0], int(child.tag[1:])
            if kind == "p":
                pieces.append(Piece("", self._point_style(index), index))
            else:
                add_text("".join(child.itertext()), index)
            add_text(child.tail, base)
        return pieces

    def _style(self, style: Hashable) -> int:
        try:
            return self.styles.index(style)
        except ValueError:
            self.styles.append(style)
            return len(self.styles) - 1

    def _point_style(self, index: int) -> int:
        return next(piece.style for piece in self._pieces if piece.point == index)
