"""DeepL's glossary API (v2 and v3), through the official `deepl` Python client against a real
server whose store is a SQLite file of its own: the client's calls work and its exceptions fire
where DeepL's would; raw requests for what the client never sends (malformed entries, bodies
past the limits, another key's glossary), each refused in DeepL's body with nothing written.
The entries' rules themselves are checked on glossary_entries.py directly (no server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import deepl
import httpx
import pytest
from deepl.api_data import MultilingualGlossaryDictionaryEntries as Entries

from service.http.glossary_entries import EntriesTooLarge, EntryLimits, InvalidEntries, read_entries
from tests.http.openapi_examples import body_schema, documented, example_of, query_parameters
from tests.servers import Server, running_server

MAX_ENTRIES = 40
MAX_BYTES = 4000  # of entries per request: far below the body limit (1 MiB + this)
KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("glossary-logs")


def glossary_server(bundle: Path, logs: Path, folder: Path, **settings: object):
    return running_server(
        bundle,
        logs,
        threads=1,
        database_url=f"sqlite:///{folder / 'glossaries.db'}",
        max_glossary_entries=MAX_ENTRIES,
        max_glossary_bytes=MAX_BYTES,
        **settings,
    )


@pytest.fixture(scope="module")
def server(fr_en_bundle: Path, logs: Path, tmp_path_factory) -> Iterator[Server]:
    with glossary_server(fr_en_bundle, logs, tmp_path_factory.mktemp("open-db")) as server:
        yield server


@pytest.fixture(scope="module")
def keyed(fr_en_bundle: Path, logs: Path, tmp_path_factory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("keyed-db")
    with glossary_server(fr_en_bundle, logs, folder, api_keys=",".join(KEYS)) as server:
        yield server


def translator(server: Server, key: str = "any-key") -> deepl.Translator:
    return deepl.Translator(key, server_url=server.url, send_platform_info=False)


def client(server: Server, key: str = "any-key") -> deepl.DeepLClient:
    return deepl.DeepLClient(key, server_url=server.url, send_platform_info=False)


def call(server: Server, method: str, path: str, key: str = "any-key", **kwargs: Any):
    headers = {"authorization": f"DeepL-Auth-Key {key}", **kwargs.pop("headers", {})}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=60, **kwargs)


def stored(server: Server, key: str = "any-key") -> list[dict]:
    """Every glossary the key has, as v3 lists them (v2 lists only the one-pair ones)."""
    answer = call(server, "GET", "/v3/glossaries", key)
    assert answer.status_code == 200, answer.text
    return answer.json()["glossaries"]


def refused(answer: httpx.Response, status: int, *words: str) -> str:
    """The answer is DeepL's error: the status, a {"message"} body naming `words`."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert list(body) == ["message"], body
    for word in words:
        assert word in body["message"], body["message"]
    return body["message"]


def v2_body(entries: str, **fields: str) -> dict[str, str]:
    return {"name": "test", "source_lang": "FR", "target_lang": "EN", "entries": entries, **fields}


# --- the official client -------------------------------------------------------------------


def test_the_v2_client_creates_lists_reads_and_deletes_a_glossary(server: Server):
    deepl_translator = translator(server)
    entries = {"vélo": "bicycle", "chien": "hound", "un homme": "a gentleman"}
    before = datetime.now(UTC) - timedelta(seconds=5)
    created = deepl_translator.create_glossary("Sport", "FR", "EN-GB", entries)
    assert (created.name, created.source_lang, created.target_lang) == ("Sport", "FR", "EN")
    assert created.ready and created.entry_count == 3
    assert before <= created.creation_time <= datetime.now(UTC) + timedelta(seconds=5)
    listed = deepl_translator.list_glossaries()
    assert created.glossary_id in [g.glossary_id for g in listed]
    found = deepl_translator.get_glossary(created.glossary_id)
    assert (found.name, found.entry_count, found.creation_time) == (
        "Sport",
        3,
        created.creation_time,
    )
    assert deepl_translator.get_glossary_entries(created) == entries
    from_csv = deepl_translator.create_glossary_from_csv(
        "CSV", "fr", "en", '"vélo, rouge",red bicycle\n"il dit ""oui""",he says yes\n'
    )
    assert deepl_translator.get_glossary_entries(from_csv) == {
        "vélo, rouge": "red bicycle",
        'il dit "oui"': "he says yes",
    }
    for glossary in (created, from_csv):
        deepl_translator.delete_glossary(glossary)
        with pytest.raises(deepl.GlossaryNotFoundException):
            deepl_translator.get_glossary(glossary.glossary_id)
    assert created.glossary_id not in [g.glossary_id for g in deepl_translator.list_glossaries()]


def test_the_v2_language_pairs_are_the_models(server: Server):
    pairs = translator(server).get_glossary_languages()
    assert [(p.source_lang, p.target_lang) for p in pairs] == [("fr", "en")]


def test_the_v3_client_edits_a_glossarys_dictionary(server: Server):
    deepl_client = client(server)
    glossary = deepl_client.create_multilingual_glossary(
        "Animals", [Entries("FR", "EN-US", {"chien": "dog", "chat": "cat"})]
    )
    assert [(d.source_lang, d.target_lang, d.entry_count) for d in glossary.dictionaries] == [
        ("FR", "EN", 2)
    ]

    def entries() -> dict[str, str]:
        (found,) = deepl_client.get_multilingual_glossary_entries(glossary, "FR", "EN").dictionaries
        return deepl.convert_tsv_to_dict(found.entries)  # the API's TSV, as the client gives it

    assert entries() == {"chien": "dog", "chat": "cat"}
    merged = deepl_client.update_multilingual_glossary_dictionary(
        glossary, Entries("fr", "en", {"chat": "kitty", "cheval": "horse"})
    )
    assert merged.dictionaries[0].entry_count == 3
    assert entries() == {"chien": "dog", "chat": "kitty", "cheval": "horse"}
    replaced = deepl_client.replace_multilingual_glossary_dictionary(
        glossary, Entries("FR", "EN", {"oiseau": "bird"})
    )
    assert (replaced.source_lang, replaced.target_lang, replaced.entry_count) == ("FR", "EN", 1)
    assert entries() == {"oiseau": "bird"}
    renamed = deepl_client.update_multilingual_glossary_name(glossary, "Birds")
    assert renamed.name == "Birds"
    listed = {g.glossary_id: g for g in deepl_client.list_multilingual_glossaries()}
    assert listed[glossary.glossary_id].name == "Birds"
    assert deepl_client.get_multilingual_glossary(glossary.glossary_id).creation_time == (
        glossary.creation_time
    )
    deepl_client.delete_multilingual_glossary_dictionary(
        glossary, source_lang="FR", target_lang="EN"
    )
    assert deepl_client.get_multilingual_glossary(glossary.glossary_id).dictionaries == []
    # v2 speaks of one language pair: a glossary of none (or several) is read through v3.
    v2 = call(server, "GET", f"/v2/glossaries/{glossary.glossary_id}")
    refused(v2, 400, "0 dictionaries", "/v3/glossaries/")
    v2 = call(server, "GET", f"/v2/glossaries/{glossary.glossary_id}/entries")
    refused(v2, 400, "0 dictionaries")
    assert glossary.glossary_id not in [g.glossary_id for g in translator(server).list_glossaries()]
    with pytest.raises(deepl.GlossaryNotFoundException, match="Dictionary not found"):
        entries()
    deepl_client.delete_multilingual_glossary(glossary)
    with pytest.raises(deepl.GlossaryNotFoundException):
        deepl_client.get_multilingual_glossary(glossary.glossary_id)
    assert glossary.glossary_id not in [
        g.glossary_id for g in deepl_client.list_multilingual_glossaries()
    ]


# --- raw requests: forms, codes, what the client does not send ------------------------------


def test_a_form_body_any_case_codes_and_surrounding_whitespace(server: Server):
    answer = call(
        server,
        "POST",
        "/v2/glossaries",
        data=v2_body(
            "  vélo \t bicycle  \r\n\n\u00a0chien\tdog\n", source_lang="fr", target_lang="en-gb"
        ),
    )
    assert answer.status_code == 201, answer.text
    created = answer.json()
    assert set(created) == {
        "glossary_id", "name", "ready", "source_lang", "target_lang", "creation_time",
        "entry_count",
    }  # fmt: skip
    assert (created["source_lang"], created["target_lang"], created["entry_count"]) == (
        "fr",
        "en",
        2,
    )
    assert created["creation_time"].endswith("Z")
    path = f"/v2/glossaries/{created['glossary_id']}"
    entries = call(
        server, "GET", f"{path}/entries", headers={"accept": "text/tab-separated-values"}
    )
    assert entries.status_code == 200
    assert entries.headers["content-type"].startswith("text/tab-separated-values")
    assert entries.text == "vélo\tbicycle\nchien\tdog"
    for accept in ("*/*", "text/*", "application/json, text/tab-separated-values;q=0.5"):
        assert call(server, "GET", f"{path}/entries", headers={"accept": accept}).status_code == 200
    for accept in ("application/json", "text/csv", "text/tab-separated-values;q=0"):
        wrong = call(server, "GET", f"{path}/entries", headers={"accept": accept})
        refused(wrong, 415, "text/tab-separated-values")
    assert call(server, "DELETE", path).status_code == 204


MALFORMED = [
    # (entries_format, entries, what the message says)
    ("tsv", "chien\tdog\nchat cat\n", ["line 2", "no tab"]),
    ("tsv", "chien\tdog\tanimal\n", ["line 1", "2 tabs"]),
    ("tsv", "chien\tdog\n\nchat\tcat\nchien\thound\n", ["line 4", "'chien'", "line 1"]),
    ("tsv", "chien\tdog\n\tcat\n", ["line 2", "source term is empty"]),
    ("tsv", "chien\t \n", ["line 1", "target term is empty"]),
    ("tsv", "chien\tdog\nch\x00at\tcat\n", ["line 2", "NUL"]),
    ("tsv", "chien\tdog\x85\n", ["line 1", "U+0085"]),
    ("tsv", "chien\td\u2028og\n", ["line 1", "U+2028"]),
    ("tsv", "chien\tdog\rchat\tcat\n", ["line 1", "carriage return"]),
    ("tsv", "chien\t" + "é" * 513 + "\n", ["line 1", "1026 bytes", "NMT_MAX_GLOSSARY_TERM_BYTES"]),
    ("tsv", "\n \n", ["no entries"]),
    ("csv", 'chien,dog\n"chat,cat\ncheval,horse\n', ["line 2", "quote"]),
    ("csv", 'chien,dog\n"chat"x,cat\n', ["line 2", "not valid CSV"]),
    ("csv", "chien,dog,animal\n", ["line 1", "3 columns"]),
    ("csv", 'chien,dog\n"ch\nat",cat\n', ["line 2", "line break"]),
    ("csv", "chien,dog\nchien,hound\n", ["line 2", "line 1"]),
    ("csv", "ch\x00ien,dog\n", ["line 1", "NUL"]),
]


@pytest.mark.parametrize(("entries_format", "entries", "words"), MALFORMED)
def test_malformed_entries_are_a_400_naming_the_line_and_nothing_is_written(
    server: Server, entries_format: str, entries: str, words: list[str]
):
    before = stored(server)
    body = v2_body(entries, entries_format=entries_format)
    answer = call(server, "POST", "/v2/glossaries", json=body)
    refused(answer, 400, "Invalid glossary entries provided", *words)
    assert stored(server) == before
    dictionary = {"source_lang": "fr", "target_lang": "en", "entries": entries,
                  "entries_format": entries_format}  # fmt: skip
    answer = call(
        server, "POST", "/v3/glossaries", json={"name": "x", "dictionaries": [dictionary]}
    )
    refused(answer, 400, "Invalid glossary entries provided", *words)
    assert stored(server) == before


def test_fields_and_pairs_that_are_refused(server: Server):
    before = stored(server)
    cases = [
        (v2_body("a\tb", source_lang="DE"), "Unsupported glossary source and target language pair"),
        (v2_body("a\tb", source_lang="EN", target_lang="FR"), "pairs: FR-EN"),
        (v2_body("a\tb", source_lang="f r"), "Value for 'source_lang' not supported"),
        (v2_body("a\tb", entries_format="xlsx"), "Value for 'entries_format' not supported"),
        ({k: v for k, v in v2_body("a\tb").items() if k != "name"}, "Parameter 'name'"),
        ({k: v for k, v in v2_body("a\tb").items() if k != "entries"}, "Parameter 'entries'"),
        (v2_body("a\tb", name="   "), "blank"),
        (v2_body("a\tb", name="x\ny"), "line break"),
        (v2_body("a\tb", name="n" * 1025), "NMT_MAX_GLOSSARY_TERM_BYTES"),
    ]
    for body, words in cases:
        refused(call(server, "POST", "/v2/glossaries", json=body), 400, words)
    twice = {"source_lang": "FR", "target_lang": "EN", "entries": "a\tb"}
    for dictionaries, words in [
        ([twice, {**twice, "target_lang": "EN-GB"}], "two dictionaries for FR-EN"),
        ([], "Parameter 'dictionaries' not specified"),
        ("fr\ten", "a list of objects"),
        ([{**twice, "source_lang": None}], "Parameter 'dictionaries[0].source_lang'"),
    ]:
        body = {"name": "x", "dictionaries": dictionaries}
        refused(call(server, "POST", "/v3/glossaries", json=body), 400, words)
    assert stored(server) == before


def test_limits_are_413_and_nothing_is_written(server: Server):
    before = stored(server)
    many = "".join(f"mot{i}\tword{i}\n" for i in range(MAX_ENTRIES + 1))
    answer = call(server, "POST", "/v2/glossaries", json=v2_body(many))
    refused(answer, 413, "Glossary too large", f"more than {MAX_ENTRIES} entries", "line 41",
            "NMT_MAX_GLOSSARY_ENTRIES")  # fmt: skip
    large = "".join(f"mot{i}\t{'w' * 200}\n" for i in range(25))  # 25 entries, > 4000 bytes
    answer = call(server, "POST", "/v2/glossaries", json=v2_body(large))
    refused(answer, 413, "Glossary too large", "NMT_MAX_GLOSSARY_BYTES")
    # A glossary's body may pass NMT_MAX_BODY_BYTES (1 MiB) by NMT_MAX_GLOSSARY_BYTES: this one
    # reaches the route, which counts its entries; a translation's may not.
    past_one_mib = v2_body("x" * (1_048_576 + 1000))
    answer = call(server, "POST", "/v2/glossaries", json=past_one_mib)
    refused(answer, 413, "Glossary too large", "NMT_MAX_GLOSSARY_BYTES")
    answer = call(server, "POST", "/v2/translate", json={"text": past_one_mib["entries"]})
    refused(answer, 413, "NMT_MAX_BODY_BYTES")
    # A body past NMT_MAX_BODY_BYTES + NMT_MAX_GLOSSARY_BYTES is refused before it is read.
    huge = v2_body("a\tb\n" * 300_000)  # 1.2 MB
    refused(call(server, "POST", "/v2/glossaries", json=huge), 413, "NMT_MAX_BODY_BYTES")
    assert stored(server) == before


def test_a_merge_past_the_entry_limit_is_refused_and_the_dictionary_kept(server: Server):
    deepl_client = client(server)
    first = {f"mot{i}": f"word{i}" for i in range(MAX_ENTRIES - 5)}
    glossary = deepl_client.create_multilingual_glossary("big", [Entries("FR", "EN", first)])
    more = {f"autre{i}": f"other{i}" for i in range(10)}
    tsv = "\n".join(f"{s}\t{t}" for s, t in more.items())
    body = {"dictionaries": [{"source_lang": "fr", "target_lang": "en", "entries": tsv}]}
    path = f"/v3/glossaries/{glossary.glossary_id}"
    refused(call(server, "PATCH", path, json=body), 413, f"would have {MAX_ENTRIES + 5} entries")
    (kept,) = deepl_client.get_multilingual_glossary_entries(glossary, "FR", "EN").dictionaries
    assert deepl.convert_tsv_to_dict(kept.entries) == first
    other_pair = {**body["dictionaries"][0], "source_lang": "de"}
    two = {"dictionaries": [*body["dictionaries"], other_pair]}
    refused(call(server, "PATCH", path, json=two), 400, "one dictionary")
    within = {"mot0": "first word", "nouveau": "new"}  # one changed, one added
    deepl_client.update_multilingual_glossary_dictionary(glossary, Entries("FR", "EN", within))
    (merged,) = deepl_client.get_multilingual_glossary_entries(glossary, "FR", "EN").dictionaries
    assert deepl.convert_tsv_to_dict(merged.entries) == {**first, **within}
    deepl_client.delete_multilingual_glossary(glossary)


UNKNOWN = "0b0d2a3c-9d8e-4a5f-8b6c-7d1e2f3a4b5c"
ON_AN_ID = [
    ("GET", "/v2/glossaries/{}", {}),
    ("GET", "/v2/glossaries/{}/entries", {}),
    ("DELETE", "/v2/glossaries/{}", {}),
    ("GET", "/v3/glossaries/{}", {}),
    ("PATCH", "/v3/glossaries/{}", {"json": {"name": "other"}}),
    ("DELETE", "/v3/glossaries/{}", {}),
    ("GET", "/v3/glossaries/{}/entries?source_lang=FR&target_lang=EN", {}),
    ("PUT", "/v3/glossaries/{}/dictionaries",
     {"json": {"source_lang": "FR", "target_lang": "EN", "entries": "a\tb"}}),
    ("DELETE", "/v3/glossaries/{}/dictionaries?source_lang=FR&target_lang=EN", {}),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "options"), ON_AN_ID)
def test_an_unknown_glossary_is_a_404(server: Server, method: str, path: str, options: dict):
    before = stored(server)
    for glossary_id in (UNKNOWN, "not-an-id"):
        answer = call(server, method, path.format(glossary_id), **options)
        refused(answer, 404, "Glossary not found")
    assert stored(server) == before


def test_a_405_names_every_method_of_a_glossary_path(server: Server):
    answer = call(server, "PUT", f"/v3/glossaries/{UNKNOWN}")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "DELETE, GET, PATCH"
    assert answer.json() == {"message": "Method Not Allowed"}
    answer = call(server, "GET", f"/v3/glossaries/{UNKNOWN}/nothing")
    assert answer.status_code == 404 and list(answer.json()) == ["message"]


# --- the OpenAPI document -----------------------------------------------------------------


def test_the_openapi_document_names_the_fields_each_glossary_call_reads(server: Server):
    """A request made of what /openapi.json documents works, and one without any field it
    documents as required is refused naming that field (the fields are read from the query
    or the body by hand, so FastAPI cannot document them by itself)."""
    spec = httpx.get(f"{server.url}/openapi.json", timeout=60).json()

    def body_call(operation_id: str, glossary_id: str = "", omit: str = "") -> httpx.Response:
        method, path, operation = documented(spec, operation_id)
        body = example_of(body_schema(operation, "application/json"))
        body = {k: v for k, v in body.items() if k != omit}
        return call(server, method, path.format(glossary_id=glossary_id), json=body)

    def query_call(operation_id: str, glossary_id: str, omit: str = "") -> httpx.Response:
        method, path, operation = documented(spec, operation_id)
        query = {
            p["name"]: p["schema"]["example"]
            for p in query_parameters(operation)
            if p["name"] != omit
        }
        return call(server, method, path.format(glossary_id=glossary_id), params=query)

    def required(operation_id: str) -> list[str]:
        operation = documented(spec, operation_id)[2]
        if "requestBody" in operation:
            return body_schema(operation, "application/json")["required"]
        return [p["name"] for p in query_parameters(operation)]

    before = stored(server)
    for operation_id in ("createGlossary", "createMultilingualGlossary"):
        assert required(operation_id), operation_id
        for field in required(operation_id):
            refused(body_call(operation_id, omit=field), 400, f"'{field}' not specified")
        assert stored(server) == before
    v2 = body_call("createGlossary")
    assert v2.status_code == 201, v2.text
    v3 = body_call("createMultilingualGlossary")
    assert v3.status_code == 201, v3.text
    glossary_id = v3.json()["glossary_id"]

    for field in required("replaceDictionary"):
        refused(body_call("replaceDictionary", glossary_id, field), 400, f"'{field}' not specified")
    assert body_call("replaceDictionary", glossary_id).status_code == 200
    assert body_call("patchMultilingualGlossary", glossary_id).status_code == 200
    for operation_id in ("getMultilingualGlossaryEntries", "deleteDictionary"):
        assert required(operation_id) == ["source_lang", "target_lang"]
        for field in required(operation_id):
            answer = query_call(operation_id, glossary_id, field)
            refused(answer, 400, f"'{field}' not specified")
    entries = query_call("getMultilingualGlossaryEntries", glossary_id)
    assert entries.status_code == 200 and "dog" in entries.json()["dictionaries"][0]["entries"]
    assert query_call("deleteDictionary", glossary_id).status_code == 204
    for made in (v2, v3):
        deleted = call(server, "DELETE", f"/v3/glossaries/{made.json()['glossary_id']}")
        assert deleted.status_code == 204
    assert stored(server) == before


# --- keys ---------------------------------------------------------------------------------


def test_another_keys_glossary_is_a_404_and_stays_its_owners(keyed: Server):
    owner = client(keyed, KEYS[0])
    glossary = owner.create_multilingual_glossary("mine", [Entries("FR", "EN", {"chat": "cat"})])
    other = KEYS[1]
    assert stored(keyed, other) == []
    assert call(keyed, "GET", "/v2/glossaries", other).json() == {"glossaries": []}
    for method, path, options in ON_AN_ID:
        answer = call(keyed, method, path.format(glossary.glossary_id), other, **options)
        refused(answer, 404, "Glossary not found")
    with pytest.raises(deepl.GlossaryNotFoundException):
        client(keyed, other).get_multilingual_glossary_entries(glossary, "FR", "EN")
    (still,) = owner.get_multilingual_glossary_entries(glossary, "FR", "EN").dictionaries
    assert still.entries == "chat\tcat"
    assert [g.name for g in owner.list_multilingual_glossaries()] == ["mine"]
    for key in (None, "wrong-key"):
        headers = {} if key is None else {"authorization": f"DeepL-Auth-Key {key}"}
        answer = httpx.get(f"{keyed.url}/v3/glossaries", headers=headers, timeout=60)
        assert answer.status_code == 403, answer.text
        assert answer.json() == {"message": "Authorization failure, check auth_key."}
    with pytest.raises(deepl.AuthorizationException):
        translator(keyed, "wrong-key").list_glossaries()
    owner.delete_multilingual_glossary(glossary)
    assert stored(keyed, KEYS[0]) == []


# --- the entries' rules, without a server -----------------------------------------------------

LIMITS = EntryLimits(max_entries=3, max_term_bytes=10)


def test_tsv_lines_end_in_lf_or_crlf_and_blank_lines_count():
    entries = read_entries("a\tb\r\n\r\n  \nc\td", "tsv", "fr", "en", LIMITS)
    assert entries == (("a", "b"), ("c", "d"))
    with pytest.raises(InvalidEntries, match=r"^line 4: ") as raised:
        read_entries("a\tb\r\n\r\n  \nc d", "tsv", "fr", "en", LIMITS)
    assert raised.value.line == 4


def test_csv_quotes_and_language_columns():
    text = 'a,b,FR,EN-GB\r\n"x, y","say ""hi""",fr,en\nother,pair,de,en\n'
    assert read_entries(text, "csv", "fr", "en", LIMITS) == (
        ("a", "b"),
        ("x, y", 'say "hi"'),
    )  # the de->en line is another dictionary's
    with pytest.raises(InvalidEntries, match="no entries"):
        read_entries("a,b,de,en\n", "csv", "fr", "en", LIMITS)
    with pytest.raises(InvalidEntries, match=r"^line 4: has 3 columns"):
        read_entries("a,b\n\n\nd,e,f\n", "csv", "fr", "en", LIMITS)


def test_the_entry_limit_names_the_line_one_too_many():
    with pytest.raises(EntriesTooLarge, match="line 5") as raised:
        read_entries("a\t1\nb\t2\n\nc\t3\nd\t4\n", "tsv", "fr", "en", LIMITS)
    assert raised.value.setting == "NMT_MAX_GLOSSARY_ENTRIES"
    assert read_entries("a\t1\nb\t2\nc\t3", "tsv", "fr", "en", LIMITS)[-1] == ("c", "3")


def test_a_byte_order_mark_at_the_start_is_the_files_not_the_first_terms():
    """Excel saves "CSV UTF-8" with one: the first term is "chien", not "\ufeffchien"."""
    for text, entries_format in (
        ("\ufeffchien\thound\nchat\tcat", "tsv"),
        ("\ufeffchien,hound", "csv"),
    ):
        assert read_entries(text, entries_format, "fr", "en", LIMITS)[0] == ("chien", "hound")


def test_a_lone_surrogate_is_refused():
    with pytest.raises(InvalidEntries, match="surrogate"):
        read_entries("a\ud800\tb", "tsv", "fr", "en", LIMITS)


def test_a_form_glossary_may_be_as_large_as_a_json_one(fr_en_bundle: Path, logs: Path, tmp_path):
    """A form's field is not capped at Starlette's 1 MiB a part: entries up to
    NMT_MAX_GLOSSARY_BYTES come in a form as in JSON (here 1.6 MB of them)."""
    entries = "".join(f"mot{n}\tword{n}\n" for n in range(100_000))
    assert len(entries.encode()) > 1 << 20
    with running_server(
        fr_en_bundle,
        logs,
        threads=1,
        database_url=f"sqlite:///{tmp_path / 'glossaries.db'}",
        max_glossary_bytes=2_000_000,
        max_glossary_entries=200_000,
    ) as big:
        answer = call(
            big, "POST", "/v2/glossaries", data=v2_body(entries, source_lang="fr", target_lang="en")
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["entry_count"] == 100_000


def test_a_json_body_past_the_body_limit_is_read_in_a_child_and_bounded(
    fr_en_bundle: Path, logs: Path, tmp_path: Path
):
    """A glossary route's JSON body larger than NMT_MAX_BODY_BYTES is parsed by a child
    process (json.loads held the event loop 0.5-0.6 s for 10 MB of small values): a real
    glossary comes through whole, one of too many values is a clear 400, broken JSON the usual
    one."""
    entries = "".join(f"mot{n}\tword{n}\n" for n in range(5_000))  # about 70 KB
    with running_server(
        fr_en_bundle,
        logs,
        threads=1,
        database_url=f"sqlite:///{tmp_path / 'glossaries.db'}",
        max_body_bytes=20_000,
        max_glossary_bytes=200_000,
    ) as small:
        created = call(small, "POST", "/v2/glossaries", json=v2_body(entries))
        assert created.status_code == 201, created.text
        glossary = created.json()["glossary_id"]
        back = call(small, "GET", f"/v2/glossaries/{glossary}/entries")
        assert back.text == entries.rstrip("\n")  # DeepL sends no line end after the last
        many = "{" + ",".join(f'"k{n}": 1' for n in range(15_000)) + "}"
        assert 20_000 < len(many) < 220_000
        headers = {"content-type": "application/json"}
        answer = call(small, "POST", "/v2/glossaries", content=many, headers=headers)
        refused(answer, 400, "more than 10000 JSON values", "entries")
        nested = '{"a": ' + "[" * 600 + "]" * 600 + ', "p": "' + "x" * 30_000 + '"}'
        answer = call(small, "POST", "/v2/glossaries", content=nested, headers=headers)
        refused(answer, 400, "Invalid JSON")  # (pickling it back was a 500)
        broken = json.dumps(v2_body(entries))[:-2]
        answer = call(small, "POST", "/v2/glossaries", content=broken, headers=headers)
        refused(answer, 400, "Invalid JSON")
