"""Sentence splitting and rejoining: the layout between sentences survives translation."""

from __future__ import annotations

import pytest

from service.serving.sentences import split_sentences


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Un homme marche.", ["Un homme marche."]),
        ("Il pleut. Le chien dort.", ["Il pleut.", "Le chien dort."]),
        ("Quoi ? Non ! Si.", ["Quoi ?", "Non !", "Si."]),
        ("Il a dit « oui. » Puis il est parti.", ["Il a dit « oui. » Puis il est parti."]),
        ('Elle dit "Bonjour." Il répond.', ['Elle dit "Bonjour."', "Il répond."]),
        ("Attends... Voilà.", ["Attends...", "Voilà."]),
        ("Il y a 3 chats. 2 dorment.", ["Il y a 3 chats.", "2 dorment."]),
        # Not sentence ends: a lower-case continuation, titles, initials.
        ("Un chat, etc. et un chien.", ["Un chat, etc. et un chien."]),
        ("M. Dupont et Mme. Durand arrivent.", ["M. Dupont et Mme. Durand arrivent."]),
        ("J. K. Rowling écrit. Il lit.", ["J. K. Rowling écrit.", "Il lit."]),
        ("Dr. Martin arrive.", ["Dr. Martin arrive."]),
        # A line break always ends a sentence, punctuation or not.
        ("Titre\nUn homme marche", ["Titre", "Un homme marche"]),
        # Other languages a multilingual model serves.
        ("¿Qué tal? Bien. Sr. García llega.", ["¿Qué tal?", "Bien.", "Sr. García llega."]),
        (
            "Am 3. Oktober war es kalt. Hr. Müller kam.",
            ["Am 3. Oktober war es kalt.", "Hr. Müller kam."],
        ),
        ("Привет. Как дела?", ["Привет.", "Как дела?"]),
        # Scripts without case: any letter may start a sentence.
        ("यह एक वाक्य है। यह दूसरा है।", ["यह एक वाक्य है।", "यह दूसरा है।"]),
        ("هل أنت بخير؟ نعم، شكرا.", ["هل أنت بخير؟", "نعم، شكرا."]),
        ("שלום. מה שלומך?", ["שלום.", "מה שלומך?"]),
        # Chinese and Japanese end sentences with no space after them.
        ("今日は晴れです。明日は雨でしょう。", ["今日は晴れです。", "明日は雨でしょう。"]),
        ("他说：“你好。”我们走吧！好吗？", ["他说：“你好。”", "我们走吧！", "好吗？"]),
        # Not ends: a decimal point, a period inside a word.
        ("3.14 est pi. Et x.y aussi.", ["3.14 est pi.", "Et x.y aussi."]),
    ],
)
def test_split(text: str, sentences: list[str]):
    assert split_sentences(text).sentences == sentences


def test_the_whitespace_between_sentences_is_kept_and_the_ends_are_trimmed():
    text = "  Il pleut.   Le chien dort.\n\n  Un chat !\tUn oiseau.\n"
    split = split_sentences(text)
    assert split.sentences == ["Il pleut.", "Le chien dort.", "Un chat !", "Un oiseau."]
    assert split.separators == ["   ", "\n\n  ", "\t"]
    assert split.join(split.sentences) == text.strip()
    assert split.join(["A", "B", "C", "D"]) == "A   B\n\n  C\tD"


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t \n "])
def test_empty_or_blank_text_has_no_sentence(text: str):
    split = split_sentences(text)
    assert split.sentences == []
    assert split.join([]) == ""


def test_join_refuses_a_wrong_number_of_translations():
    with pytest.raises(ValueError, match="1 translations for 2 sentences"):
        split_sentences("Un. Deux.").join(["One."])


def test_cjk_sentences_are_rejoined_without_a_space():
    split = split_sentences("今日は晴れです。明日は雨でしょう。")
    assert split.separators == [""]
    assert split.join(["It is sunny.", "It will rain."]) == "It is sunny.It will rain."


def test_blank_lines_inside_a_text_are_separators_not_sentences():
    split = split_sentences("Un.\n\n\nDeux.")
    assert split.sentences == ["Un.", "Deux."]
    assert split.separators == ["\n\n\n"]
