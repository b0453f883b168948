"""Markup in, markup out: HTML (LibreTranslate `format=html`, DeepL `tag_handling=html`) and XML
(DeepL `tag_handling=xml`) translated with each tag carried to the words it wrapped.

How, the way Bergamot carries HTML:

1. **Parse** with a real parser: `html.parser` for HTML (lenient, as browsers are: an unclosed
   element is closed where its parent ends, a stray end tag is dropped; but a `<script>` or
   `<style>` never closed is a MarkupError, since all the text after it would be script),
   expat for XML (strict: markup it cannot read is a MarkupError, which each dialect answers
   with its 400).
2. **Lay out**: structural elements (p, div, li, h1 ... in HTML; DeepL's `splitting_tags`; in
   XML, the outline DeepL detects) stay where they are. What lies between them is a *run*:
   text, *spans* (inline elements that wrap text: b, i, a, span ...) and *points* (markup that
   wraps no text: br, img, comments, and in HTML script, style, code and the like). Elements
   the client leaves untranslated (`translate="no"`, `class="notranslate"`, `ignore_tags`)
   are *opaque* spans: the model reads their words, they are copied as they are.
3. **Translate** each run's plain text (entities unescaped) sentence by sentence through the
   pipeline with alignment on: every sentence comes back with its hard word alignment, the
   decoder's cross-attention (the same as `return_alignment`).
4. **Place**: each span goes around the target words aligned to the source words it wrapped
   (the smallest stretch that holds them), inside its parent and apart from every span that
   is not its ancestor (as in the source: siblings never nest);
   each point goes to the place that best separates the target words aligned before it from
   those aligned after it. Where the alignment says nothing (no target word aligned to a span's
   words, or a sentence without alignment), the relative position in the sentence decides.
5. **Write** the output from this tree: it is well-formed whatever the alignment said, and holds
   each element of the input exactly once. Tags hug words (the whitespace between words stays
   outside them, so spacing never doubles or disappears); punctuation at a word's edge is
   inside a tag only if it was in the source. Attribute values, comments, points, opaque
   spans and runs with nothing to translate are copied byte for byte; translated text is
   escaped again.
"""

from service.documents.markup.layout import Document, read, read_off_loop, sentences
from service.documents.markup.target import SentenceTranslation
from service.documents.markup.translation import from_pipeline, model_sentences, translate, write
from service.documents.markup.tree import (
    HTML_BLOCKS,
    HTML_IGNORED,
    MAX_DEPTH,
    Element,
    MarkupError,
    MarkupKind,
    MarkupOptions,
    Opaque,
    Text,
    parse,
    verbatim,
)

__all__ = [
    "HTML_BLOCKS",
    "HTML_IGNORED",
    "MAX_DEPTH",
    "Document",
    "Element",
    "MarkupError",
    "MarkupKind",
    "MarkupOptions",
    "Opaque",
    "SentenceTranslation",
    "Text",
    "from_pipeline",
    "model_sentences",
    "parse",
    "read",
    "read_off_loop",
    "sentences",
    "translate",
    "verbatim",
    "write",
]
