"""Glossaries on translations, against a real server: the official `deepl` client's
`translate_text(..., glossary=...)` (v2 and v3 glossaries), the native API's `glossary_id`
and inline `glossary`, and what each refuses (no source_lang, an unknown glossary, another
key's). Whether the terms are written is held to the model in tests/runtime/test_constrained.py;
here, that the terms reach the decoder and come back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import deepl
import httpx
import pytest
from deepl.api_data import MultilingualGlossaryDictionaryEntries

from tests.servers import Server, running_server

KEYS = ("key-a", "key-b")
TEXTS = ["Un chien court dans l'herbe verte.", "Deux hommes jouent au football dans un parc."]


@pytest.fixture(scope="module")
def server(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("glossary-translation")
    (folder / "logs").mkdir()
    with running_server(
        fr_en_bundle,
        folder / "logs",
        threads=1,
        database_url=f"sqlite:///{folder / 'store.db'}",
        api_keys=",".join(KEYS),
    ) as server:
        yield server


def deepl_client(server: Server, key: str = KEYS[0]) -> deepl.DeepLClient:
    return deepl.DeepLClient(key, server_url=server.url, send_platform_info=False)


def native(server: Server, body: dict, key: str = KEYS[0]) -> httpx.Response:
    body = {"text": TEXTS, "source_lang": "fr", "target_lang": "en", **body}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{server.url}/v1/translate", json=body, headers=headers, timeout=60)


def test_the_deepl_client_translates_with_a_v2_and_a_v3_glossary(server: Server) -> None:
    client = deepl_client(server)
    v2 = client.create_glossary("dogs", "FR", "EN", {"chien": "hound"})
    found = client.translate_text(TEXTS, source_lang="FR", target_lang="EN-GB", glossary=v2)
    assert "hound" in found[0].text.lower()  # (the model may still say "hound dog")
    plain = client.translate_text(TEXTS, source_lang="FR", target_lang="EN-GB")
    assert found[1].text == plain[1].text  # no term in it: as without the glossary
    entries = MultilingualGlossaryDictionaryEntries("FR", "EN", {"herbe": "turf"})
    v3 = client.create_multilingual_glossary("grass", [entries])
    found = client.translate_text(TEXTS[0], source_lang="FR", target_lang="EN-US", glossary=v3)
    assert "turf" in found.text.lower()


def test_a_glossary_needs_source_lang_and_an_id_this_key_made(server: Server) -> None:
    glossary = deepl_client(server).create_glossary("dogs", "FR", "EN", {"chien": "hound"})
    headers = {"authorization": f"DeepL-Auth-Key {KEYS[0]}"}
    url = f"{server.url}/v2/translate"
    body = {"text": TEXTS, "target_lang": "EN", "glossary_id": glossary.glossary_id}
    answer = httpx.post(url, json=body, headers=headers, timeout=60)
    assert answer.status_code == 400 and "source_lang" in answer.json()["message"]
    with pytest.raises(deepl.DeepLException):  # another key's glossary: not found
        deepl_client(server, KEYS[1]).translate_text(
            TEXTS, source_lang="FR", target_lang="EN-GB", glossary=glossary.glossary_id
        )
    body |= {"source_lang": "FR", "glossary_id": "no-such-glossary"}
    answer = httpx.post(url, json=body, headers=headers, timeout=60)
    assert answer.status_code == 404 and answer.json() == {"message": "Glossary not found."}


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (" ", "glossary_term"),  # empty once stripped, as a stored entry's term
        ("hound\tdog", "glossary_term"),  # a control character
        ("\u200b", "glossary_term_unwritable"),  # nothing the model can write
    ],
)
def test_an_inline_term_is_held_to_the_rules_of_a_stored_one(
    server: Server, target: str, kind: str
) -> None:
    # Found by fuzzing: these targets reached the search as zero tokens (a 500).
    answer = native(server, {"glossary": [{"source": "chien", "target": target}]})
    assert answer.status_code == 422, answer.text
    assert [error["type"] for error in answer.json()["detail"]] == [kind]


def test_a_stored_term_the_model_cannot_write_is_a_deepl_400(server: Server) -> None:
    glossary = deepl_client(server).create_glossary("bom", "FR", "EN", {"chien": "\ufeff"})
    with pytest.raises(deepl.DeepLException, match="'chien'"):
        deepl_client(server).translate_text(
            TEXTS[0], source_lang="FR", target_lang="EN-US", glossary=glossary
        )


def test_the_native_api_takes_a_glossary_id_or_inline_terms(server: Server) -> None:
    inline = native(server, {"glossary": [{"source": "chien", "target": "hound"}]})
    assert inline.status_code == 200, inline.text
    assert "hound" in inline.json()["translations"][0]["text"].lower()
    usage = inline.json()["usage"]
    assert (usage["glossary_terms"], usage["glossary_terms_kept"]) == (1, 1)
    glossary = deepl_client(server).create_glossary("dogs", "FR", "EN", {"chien": "hound"})
    by_id = native(server, {"glossary_id": glossary.glossary_id})
    assert by_id.json()["translations"] == inline.json()["translations"]
    assert native(server, {"glossary_id": glossary.glossary_id}, KEYS[1]).status_code == 404
    both = native(server, {"glossary_id": "x", "glossary": []})
    assert both.status_code == 422
    plain = native(server, {})
    assert "glossary_terms" not in plain.json()["usage"]


@pytest.mark.parametrize(
    ("marked", "tag_handling", "extra"),
    [
        ('Le <span translate="no">chien</span> court dans la rue.', "html", {}),
        ('Le <span class="notranslate">chien</span> court dans la rue.', "html", {}),
        ("Le <keep>chien</keep> court dans la rue.", "xml", {"ignore_tags": ["keep"]}),
    ],
)
def test_a_term_in_words_left_untranslated_is_not_written(
    server: Server, marked: str, tag_handling: str, extra: dict
) -> None:
    """The element comes back as it was, "chien" and all: the term written beside it made the
    dog twice ("The hound <span translate="no">chien</span> is running"). The same term
    outside such an element is written."""
    client = deepl_client(server)
    glossary = client.create_glossary("dogs", "FR", "EN", {"chien": "hound"})
    found = client.translate_text(
        [marked, "Le chien court dans la rue."],
        source_lang="FR",
        target_lang="EN-GB",
        glossary=glossary,
        tag_handling=tag_handling,
        **extra,
    )
    assert "chien" in found[0].text and "hound" not in found[0].text.lower(), found[0].text
    assert "hound" in found[1].text.lower(), found[1].text
    # Nor is it counted as a term asked for and lost (nmt_glossary_terms_kept_ratio would
    # observe 0 for the first text alone: an alert about terms being lost).
    before = terms_kept_observed(server)
    client.translate_text(
        marked, source_lang="FR", target_lang="EN-GB", glossary=glossary,
        tag_handling=tag_handling, **extra,
    )  # fmt: skip
    assert terms_kept_observed(server) == before


def terms_kept_observed(server: Server) -> tuple[float, float]:
    """nmt_glossary_terms_kept_ratio's count and sum, over every model."""
    count = total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=60).text.splitlines():
        if line.startswith("nmt_glossary_terms_kept_ratio_count"):
            count += float(line.split()[-1])
        elif line.startswith("nmt_glossary_terms_kept_ratio_sum"):
            total += float(line.split()[-1])
    return count, total
