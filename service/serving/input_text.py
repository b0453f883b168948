"""What a client's text must be before it reaches the tokenizer, and what is not worth a model.

* Lone surrogates (`"\\ud800"` escaped in JSON) are not Unicode text: no encoder can take them,
  so such a text is refused with a 422 that says where, rather than failing deep inside.
* Control characters (C0 and C1, but tab, line feed and carriage return) carry no meaning a
  translation can keep, and invent words when fed to the model: each becomes a space.
* Invisible formatting characters (bidirectional embeddings, overrides and isolates, the
  soft hyphen, the word joiner, the zero-width no-break space) are not given to the model:
  they say how text is shown, not what it says, and the tokenizer keeps some of them as
  pieces of their own that derail a translation ("Un homme marche." with an isolate around
  it came out "A shockcking man oped man walks."). The joiners that are spelling (ZWJ in
  emoji and Indic scripts, ZWNJ in Persian) are kept.
* A run of one symbol (`!!!!!!`, `))))))`) longer than three is read as three: the model
  turns each extra mark into a token and the whole into a loop that runs to the length limit
  (a short request then held the model for seconds).
* A sentence with no letter at all (emoji, numbers, punctuation, symbols) is returned
  unchanged instead of being decoded, as DeepL and Google do: a model trained on captions
  turns such input into fluent inventions.
"""

from __future__ import annotations

import re

from service.serving.errors import InvalidInput

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Soft hyphen, Arabic letter mark, zero-width space, LRM, RLM, bidi embeddings and overrides,
# word joiner and invisible operators, bidi isolates, zero-width no-break space.
_INVISIBLE = re.compile(
    "[\u00ad\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
# One character that is neither a letter, a digit nor a space, four times or more in a row.
_SYMBOL_RUN = re.compile(r"([^\w\s])\1{3,}")
SYMBOL_RUN_KEPT = 3


def clean_text(text: str, index: int) -> str:
    """The text with control characters replaced by spaces; InvalidInput for a surrogate.
    `index` is the text's position in the request, for the error's location."""
    if found := _SURROGATE.search(text):
        raise InvalidInput(
            "invalid_unicode",
            f"holds a lone surrogate (U+{ord(found.group()):04X}) at character "
            f"{found.start()}: send valid Unicode (UTF-8)",
            text_index=index,
        )
    return _CONTROL.sub(" ", text)


def model_input(sentence: str) -> str:
    """What the model is given for a sentence that has letters: invisible formatting left out,
    runs of one symbol cut to three. (A sentence without letters never reaches the model: it
    comes back as it was.)"""
    visible = _INVISIBLE.sub("", sentence)
    return _SYMBOL_RUN.sub(lambda run: run.group(1) * SYMBOL_RUN_KEPT, visible)


def model_offset(sentence: str, at: int) -> int:
    """Where character `at` of the sentence is in model_input(sentence)."""
    return len(model_input(sentence[: max(at, 0)]))


def has_letters(sentence: str) -> bool:
    """Is there anything for the model to translate? (Any letter of any script.)"""
    return any(character.isalpha() for character in sentence)
