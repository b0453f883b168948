"""DeepL's glossary API, so that DeepL clients manage glossaries here unchanged: v2 (one language
pair per glossary: `/v2/glossaries`, `/v2/glossary-language-pairs`) and v3 (a glossary holds
dictionaries, one per language pair, editable: `/v3/glossaries`, what `deepl.DeepLClient`
speaks). Glossaries live in the store (service/store/); the entries' formats and rules in
glossary_entries.py.

As DeepL: JSON or form bodies; DeepL's language codes in any case (`EN-GB` is English), kept as
lower-case base codes; `{"message": ...}` errors: 400 for a field or entry that breaks a rule
(the line named), 404 for a glossary or dictionary this key does not have, 413 past a size
limit, 415 for entries asked in a format other than TSV. A glossary belongs to the key that made
it (with NMT_API_KEYS set): another key's glossary is a 404, as an unknown one is, so that no key
learns of another's. A language pair must be one a loaded model translates, as DeepL asks of a
pair it supports for glossaries. docs/compatibility.md lists every field.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from service.http.deepl import DEEPL, DEEPL_ERRORS, DeepLError
from service.http.dependencies import ApiKeysDep, ServiceDep, StoreDep
from service.http.dialect import documented_body
from service.http.glossary_entries import (
    ENTRIES_FORMATS,
    EntriesFormat,
    EntriesTooLarge,
    EntryLimits,
    InvalidEntries,
    check_text,
    describe,
    forbidden_character,
    read_entries,
    utf8_size,
    write_tsv,
)
from service.http.glossary_lookup import owner_of
from service.serving.access import ApiKeys
from service.serving.errors import NotReady
from service.serving.requests import TranslationService, off_loop
from service.serving.settings import Settings
from service.store.database import StoreUnavailable
from service.store.glossaries import (
    Dictionary,
    DictionaryInfo,
    DictionaryNotFound,
    GlossaryInfo,
    GlossaryNotFound,
    GlossaryStore,
    InvalidDictionary,
)
from service.store.threads import StoreThreads

log = logging.getLogger("nmt.glossaries")

TSV = "text/tab-separated-values"
# The paths of this API: these, and every path below the first two.
PREFIXES = ("/v2/glossaries", "/v3/glossaries")
GLOSSARIES = replace(
    DEEPL,
    paths=frozenset({*PREFIXES, "/v2/glossary-language-pairs"}),
    prefixes=frozenset(f"{prefix}/" for prefix in PREFIXES),
)
# A DeepL language code: a base language, then region or script subtags (EN-GB, ZH-HANS).
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8})*")
# The client's message where a glossary or dictionary is not this key's (DeepL's own words).
NOT_FOUND = "Glossary not found"
NO_DICTIONARY = "Dictionary not found"

T = TypeVar("T")

# DeepL's operationId of each route (its OpenAPI file's), by the function that serves it.
OPERATION_IDS = {
    "create_v2": "createGlossary",
    "list_v2": "listGlossaries",
    "get_v2": "getGlossary",
    "entries_v2": "getGlossaryEntries",
    "delete_v2": "deleteGlossary",
    "language_pairs": "listGlossaryLanguages",
    "create_v3": "createMultilingualGlossary",
    "list_v3": "listMultilingualGlossaries",
    "get_v3": "getMultilingualGlossary",
    "patch_v3": "patchMultilingualGlossary",
    "delete_v3": "deleteMultilingualGlossary",
    "entries_v3": "getMultilingualGlossaryEntries",
    "replace_v3": "replaceDictionary",
    "delete_dictionary_v3": "deleteDictionary",
}

# The fields each operation reads, for /openapi.json: DeepL's names (its OpenAPI file's), with
# which are required here (entries_format is optional: TSV by default).
_LANGUAGE = {
    "type": "string",
    "pattern": rf"^\s*{LANGUAGE_CODE.pattern}\s*$",
    "description": "DeepL's code, any case (FR, en, EN-GB)",
}
_DICTIONARY = {
    "source_lang": {**_LANGUAGE, "example": "FR"},
    "target_lang": {**_LANGUAGE, "example": "EN"},
    "entries": {
        "type": "string",
        "description": "one entry a line: source and target term, tab-separated (TSV) or "
        "comma-separated (CSV)",
        "example": "chien\tdog",
    },
    "entries_format": {"type": "string", "enum": sorted(ENTRIES_FORMATS), "default": "tsv"},
}
_NAME = {"type": "string", "example": "Animals"}
_PAIR = ["source_lang", "target_lang", "entries"]


def _dictionaries(max_items: int | None = None) -> dict[str, Any]:
    """The v3 `dictionaries` field: a list of dictionaries."""
    item = {"type": "object", "properties": _DICTIONARY, "required": _PAIR}
    schema: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    return schema if max_items is None else {**schema, "maxItems": max_items}


# The pair of a dictionary to read or delete, in the query.
_PAIR_QUERY = {
    "parameters": [
        {"name": name, "in": "query", "required": True, "schema": _DICTIONARY[name]}
        for name in ("source_lang", "target_lang")
    ]
}
_JSON = ("application/json",)  # (a form cannot carry the list of dictionaries)
REQUEST_DOCS: dict[str, dict[str, Any]] = {
    "createGlossary": documented_body({"name": _NAME, **_DICTIONARY}, ["name", *_PAIR]),
    "createMultilingualGlossary": documented_body(
        {"name": _NAME, "dictionaries": _dictionaries()}, ["name", "dictionaries"], _JSON
    ),
    "patchMultilingualGlossary": documented_body(
        {"name": _NAME, "dictionaries": _dictionaries(max_items=1)}, [], _JSON
    ),
    "replaceDictionary": documented_body(_DICTIONARY, _PAIR),
    "getMultilingualGlossaryEntries": _PAIR_QUERY,
    "deleteDictionary": _PAIR_QUERY,
}


async def glossary_store(store: StoreDep) -> GlossaryStore:
    return store.glossaries


GlossariesDep = Annotated[GlossaryStore, Depends(glossary_store)]


@dataclass(frozen=True)
class DictionaryRequest:
    """One dictionary as a request sends it: its fields read, its entries not yet."""

    source_lang: str
    target_lang: str
    entries: str
    entries_format: EntriesFormat

    @property
    def pair(self) -> str:
        return f"{self.source_lang}-{self.target_lang}".upper()


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter(tags=["DeepL glossaries"])

    def route(
        path: str,
        method: str,
        status: int,
        summary: str,
        errors: tuple[int, ...],
        answers: type[Response] = JSONResponse,
    ):
        """A route, with DeepL's operationId (a client generated from DeepL's OpenAPI file
        names its calls alike) and the fields it reads (REQUEST_DOCS): the endpoints read
        them from the query, a JSON or a form body alike, so FastAPI cannot see them."""

        def register(endpoint: Callable[..., Awaitable[Response]]):
            operation_id = OPERATION_IDS[endpoint.__name__]
            router.add_api_route(
                path,
                endpoint,
                methods=[method],
                operation_id=operation_id,
                status_code=status,
                summary=summary,
                response_model=None,
                response_class=answers,
                responses={code: DeepLError.doc(GLOSSARY_ERRORS[code]) for code in errors},
                openapi_extra=REQUEST_DOCS.get(operation_id),
            )
            return endpoint

        return register

    limits = EntryLimits.of(settings)

    async def answer(
        request: Request,
        keys: ApiKeys,
        respond: Callable[[dict[str, Any], str], Awaitable[Response]],
    ) -> Response:
        """DeepL's order (fields, key, then the work), with the key's owner id."""

        async def work(fields: dict[str, Any]) -> Response:
            return await respond(fields, owner_of(keys, GLOSSARIES.presented_key(request, fields)))

        return await GLOSSARIES.answer(request, keys, work)

    async def dictionaries_of(
        service: TranslationService, requested: list[DictionaryRequest]
    ) -> list[Dictionary]:
        """The entries read (off the event loop when long) and checked, and each pair one a
        model translates; the first problem as DeepL's error."""
        for dictionary in requested:
            check_pair(service, dictionary.source_lang, dictionary.target_lang)
        size = sum(len(d.entries) for d in requested)
        return await off_loop(size, _read_dictionaries, requested, limits, settings)

    # --- v2: one language pair per glossary ---------------------------------------------------

    @route("/v2/glossaries", "POST", 201, "Create a glossary (DeepL v2)", (400, 403, 413, 503))
    async def create_v2(
        request: Request, service: ServiceDep, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            name = _name(fields, settings, required=True)
            assert name is not None
            (dictionary,) = await dictionaries_of(service, [_dictionary_request(fields)])
            info = await _stored(store.threads, store.create, owner, name, [dictionary])
            return JSONResponse(_v2_view(info), 201)

        return await answer(request, keys, respond)

    @route("/v2/glossaries", "GET", 200, "List glossaries (DeepL v2)", (403,))
    async def list_v2(request: Request, keys: ApiKeysDep, store: GlossariesDep) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            found = await _stored(store.threads, store.list, owner)
            # v2 speaks of one language pair: a glossary of several (or none) is v3's.
            views = [_v2_view(info) for info in found if len(info.dictionaries) == 1]
            return JSONResponse({"glossaries": views})

        return await answer(request, keys, respond)

    @route(
        "/v2/glossaries/{glossary_id}",
        "GET",
        200,
        "A glossary's details (DeepL v2)",
        (400, 403, 404),
    )
    async def get_v2(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            info = await _stored(store.threads, store.info, owner, glossary_id)
            _one_pair(info)
            return JSONResponse(_v2_view(info))

        return await answer(request, keys, respond)

    @route(
        "/v2/glossaries/{glossary_id}/entries",
        "GET",
        200,
        "A glossary's entries, as TSV (DeepL v2)",
        (400, 403, 404, 415),
        answers=TsvResponse,
    )
    async def entries_v2(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            if not _accepts_tsv(request.headers.get("accept")):
                raise DeepLError(415, f"No supported media type in the Accept header: {TSV}")
            found = await _stored(
                store.threads, store.dictionaries, owner, glossary_id
            )  # one transaction
            if len(found) != 1:
                raise _not_one_pair(glossary_id, len(found))
            return _tsv_response(found[0].entries)

        return await answer(request, keys, respond)

    @route("/v2/glossaries/{glossary_id}", "DELETE", 204, "Delete a glossary", (403, 404))
    async def delete_v2(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            await _stored(store.threads, store.delete, owner, glossary_id)
            return Response(status_code=204)

        return await answer(request, keys, respond)

    @route(
        "/v2/glossary-language-pairs",
        "GET",
        200,
        "Language pairs a glossary may have: those the loaded models translate",
        (403,),
    )
    async def language_pairs(request: Request, service: ServiceDep, keys: ApiKeysDep) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            pairs = [{"source_lang": s, "target_lang": t} for s, t in served_pairs(service)]
            return JSONResponse({"supported_languages": pairs})

        return await answer(request, keys, respond)

    # --- v3: dictionaries, editable ---------------------------------------------------------

    @route("/v3/glossaries", "POST", 201, "Create a glossary (DeepL v3)", (400, 403, 413, 503))
    async def create_v3(
        request: Request, service: ServiceDep, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            name = _name(fields, settings, required=True)
            assert name is not None
            requested = _dictionary_list(fields, required=True)
            dictionaries = await dictionaries_of(service, requested)
            info = await _stored(store.threads, store.create, owner, name, dictionaries)
            return JSONResponse(_v3_view(info), 201)

        return await answer(request, keys, respond)

    @route("/v3/glossaries", "GET", 200, "List glossaries (DeepL v3)", (403,))
    async def list_v3(request: Request, keys: ApiKeysDep, store: GlossariesDep) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            found = await _stored(store.threads, store.list, owner)
            return JSONResponse({"glossaries": [_v3_view(info) for info in found]})

        return await answer(request, keys, respond)

    @route(
        "/v3/glossaries/{glossary_id}", "GET", 200, "A glossary's details (DeepL v3)", (403, 404)
    )
    async def get_v3(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            return JSONResponse(
                _v3_view(await _stored(store.threads, store.info, owner, glossary_id))
            )

        return await answer(request, keys, respond)

    @route(
        "/v3/glossaries/{glossary_id}",
        "PATCH",
        200,
        "Rename a glossary, or merge entries into one of its dictionaries (DeepL v3)",
        (400, 403, 404, 413, 503),
    )
    async def patch_v3(
        request: Request,
        glossary_id: str,
        service: ServiceDep,
        keys: ApiKeysDep,
        store: GlossariesDep,
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            name = _name(fields, settings, required=False)
            requested = _dictionary_list(fields, required=False)
            if len(requested) > 1:
                raise DeepLError(
                    400, "Value for 'dictionaries' not supported: a PATCH edits one dictionary."
                )
            merged = (await dictionaries_of(service, requested))[0] if requested else None
            info = await _stored(
                store.threads, store.info, owner, glossary_id
            )  # 404 before any write
            if merged is not None:
                await _within_entry_limit(store, owner, glossary_id, merged, limits)
            if name is not None or merged is not None:  # both or neither: one transaction
                changes = [merged] if merged is not None else []
                info = await _stored(store.threads, store.update, owner, glossary_id, name, changes)
            return JSONResponse(_v3_view(info))

        return await answer(request, keys, respond)

    @route(
        "/v3/glossaries/{glossary_id}", "DELETE", 204, "Delete a glossary (DeepL v3)", (403, 404)
    )
    async def delete_v3(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            await _stored(store.threads, store.delete, owner, glossary_id)
            return Response(status_code=204)

        return await answer(request, keys, respond)

    @route(
        "/v3/glossaries/{glossary_id}/entries",
        "GET",
        200,
        "The entries of one dictionary, as TSV in JSON (source_lang, target_lang)",
        (400, 403, 404),
    )
    async def entries_v3(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            source, target = _language(fields, "source_lang"), _language(fields, "target_lang")
            found = await _stored(
                store.threads, store.dictionary, owner, glossary_id, source, target
            )
            body = {
                "source_lang": found.source_lang,
                "target_lang": found.target_lang,
                "entries": write_tsv(found.entries),
                "entries_format": "tsv",
            }
            return JSONResponse({"dictionaries": [body]})

        return await answer(request, keys, respond)

    @route(
        "/v3/glossaries/{glossary_id}/dictionaries",
        "PUT",
        200,
        "Replace (or add) the dictionary of a language pair (DeepL v3)",
        (400, 403, 404, 413, 503),
    )
    async def replace_v3(
        request: Request,
        glossary_id: str,
        service: ServiceDep,
        keys: ApiKeysDep,
        store: GlossariesDep,
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            (dictionary,) = await dictionaries_of(service, [_dictionary_request(fields)])
            info = await _stored(
                store.threads, store.replace_dictionary, owner, glossary_id, dictionary
            )
            return JSONResponse(
                _dictionary_view(_pair_of(info, dictionary.source_lang, dictionary.target_lang))
            )

        return await answer(request, keys, respond)

    @route(
        "/v3/glossaries/{glossary_id}/dictionaries",
        "DELETE",
        204,
        "Delete the dictionary of a language pair (source_lang, target_lang)",
        (400, 403, 404),
    )
    async def delete_dictionary_v3(
        request: Request, glossary_id: str, keys: ApiKeysDep, store: GlossariesDep
    ) -> Response:
        async def respond(fields: dict[str, Any], owner: str) -> Response:
            source, target = _language(fields, "source_lang"), _language(fields, "target_lang")
            await _stored(
                store.threads, store.delete_dictionary, owner, glossary_id, source, target
            )
            return Response(status_code=204)

        return await answer(request, keys, respond)

    return router


# --- language pairs ------------------------------------------------------------------------------


def served_pairs(service: TranslationService) -> list[tuple[str, str]]:
    """The (source, target) base codes some loaded model translates."""
    return sorted({pair for m in service.registry.models for pair in m.pairs()})


def check_pair(service: TranslationService, source: str, target: str) -> None:
    """A pair a loaded model translates, as DeepL asks a glossary's pair to be one it supports;
    while the models load, no pair is known yet: 503, not "unsupported"."""
    if service.lifecycle.phase == "starting":
        raise NotReady("models are loading: retry shortly")
    pairs = served_pairs(service)
    if (source, target) not in pairs:
        listed = ", ".join(f"{s}-{t}".upper() for s, t in pairs) or "none"
        raise DeepLError(
            400, f"Unsupported glossary source and target language pair (pairs: {listed})."
        )


# --- fields ----------------------------------------------------------------------------------


def _text(fields: Mapping[str, Any], name: str, required: bool = True) -> str | None:
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise DeepLError(400, f"Parameter '{name}' not specified.")
        return None
    if not isinstance(value, str):
        raise DeepLError(400, f"Value for '{name}' not supported.")
    return value


def _language(fields: Mapping[str, Any], name: str, label: str | None = None) -> str:
    """A DeepL language code (`EN`, `en-gb`, `PT-BR`): its base language, lower case."""
    code = _text(fields, name) or ""
    if not LANGUAGE_CODE.fullmatch(code.strip()):
        raise DeepLError(400, f"Value for '{label or name}' not supported.")
    return code.strip().split("-")[0].lower()


def _name(fields: Mapping[str, Any], settings: Settings, required: bool) -> str | None:
    name = _text(fields, "name", required)
    if name is None:
        return None
    if not name.strip():
        raise DeepLError(400, "Value for 'name' not supported: it is blank.")
    character = forbidden_character(name)
    if character is not None:
        raise DeepLError(400, f"Value for 'name' not supported: it holds {describe(character)}.")
    size, limit = utf8_size(name), settings.max_glossary_term_bytes
    if size > limit:
        raise DeepLError(
            400,
            f"Value for 'name' not supported: it is {size} bytes in UTF-8; the limit is "
            f"{limit} (NMT_MAX_GLOSSARY_TERM_BYTES).",
        )
    return name


def _dictionary_request(fields: Mapping[str, Any], where: str = "") -> DictionaryRequest:
    """source_lang, target_lang, entries and entries_format (`tsv` by default); `where` names
    the dictionary in a list ("dictionaries[1]." )."""

    def named(name: str) -> str:
        return f"{where}{name}"

    if where:  # the messages name the list's item
        fields = {named(key): value for key, value in fields.items()}
    entries_format = (_text(fields, named("entries_format"), required=False) or "tsv").lower()
    if entries_format not in ENTRIES_FORMATS:
        raise DeepLError(400, f"Value for '{named('entries_format')}' not supported.")
    return DictionaryRequest(
        source_lang=_language(fields, named("source_lang")),
        target_lang=_language(fields, named("target_lang")),
        entries=_text(fields, named("entries")) or "",
        entries_format=entries_format,  # type: ignore[arg-type]  # one of ENTRIES_FORMATS
    )


def _dictionary_list(fields: Mapping[str, Any], required: bool) -> list[DictionaryRequest]:
    value = fields.get("dictionaries")
    if value is None or value == []:
        if required:
            raise DeepLError(400, "Parameter 'dictionaries' not specified.")
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise DeepLError(
            400,
            "Value for 'dictionaries' not supported: a list of objects (source_lang, "
            "target_lang, entries, entries_format), in a JSON body.",
        )
    requested = [_dictionary_request(item, f"dictionaries[{i}].") for i, item in enumerate(value)]
    seen: set[tuple[str, str]] = set()
    for dictionary in requested:
        pair = (dictionary.source_lang, dictionary.target_lang)
        if pair in seen:
            raise DeepLError(
                400,
                f"Value for 'dictionaries' not supported: two dictionaries for {dictionary.pair}.",
            )
        seen.add(pair)
    return requested


def _read_dictionaries(
    requested: list[DictionaryRequest], limits: EntryLimits, settings: Settings
) -> list[Dictionary]:
    """Every dictionary's entries, or DeepL's error for the first problem (400 for an entry
    that breaks a rule, 413 past a size limit). On a worker thread for a long body."""
    several = len(requested) > 1
    try:
        check_text("".join(d.entries for d in requested), settings.max_glossary_bytes)
    except EntriesTooLarge as error:
        raise DeepLError(413, f"Glossary too large: {error}.") from None
    read = []
    for dictionary in requested:
        label = f"dictionary {dictionary.pair}, " if several else ""
        try:
            entries = read_entries(
                dictionary.entries,
                dictionary.entries_format,
                dictionary.source_lang,
                dictionary.target_lang,
                limits,
            )
        except EntriesTooLarge as error:
            raise DeepLError(413, f"Glossary too large: {label}{error}.") from None
        except InvalidEntries as error:
            raise DeepLError(400, f"Invalid glossary entries provided: {label}{error}.") from None
        read.append(Dictionary(dictionary.source_lang, dictionary.target_lang, entries))
    return read


async def _within_entry_limit(
    store: GlossaryStore, owner: str, glossary_id: str, merged: Dictionary, limits: EntryLimits
) -> None:
    """A PATCH merges entries into a dictionary: the result too within
    NMT_MAX_GLOSSARY_ENTRIES, refused (413) before anything is written."""
    current = await _stored(
        store.threads,
        _sources_of,
        store,
        owner,
        glossary_id,
        merged.source_lang,
        merged.target_lang,
    )
    count = len(current | {source for source, _ in merged.entries})
    if count > limits.max_entries:
        pair = f"{merged.source_lang}-{merged.target_lang}".upper()
        raise DeepLError(
            413,
            f"Glossary too large: the dictionary {pair} would have {count} entries; the limit "
            f"is {limits.max_entries} (NMT_MAX_GLOSSARY_ENTRIES).",
        )


def _sources_of(
    store: GlossaryStore, owner: str, glossary_id: str, source: str, target: str
) -> set[str]:
    """The source terms of a dictionary; none for one the glossary does not have yet."""
    try:
        return {term for term, _ in store.dictionary(owner, glossary_id, source, target).entries}
    except DictionaryNotFound:
        return set()


# --- the store -------------------------------------------------------------------------------


async def _stored(threads: StoreThreads, call: Callable[..., T], *args: Any) -> T:
    """A store call on the store's threads (it is synchronous), its refusals as DeepL says
    them."""
    try:
        return await threads.run(call, *args)
    except GlossaryNotFound:
        raise DeepLError(404, NOT_FOUND) from None
    except DictionaryNotFound:
        raise DeepLError(404, NO_DICTIONARY) from None
    except InvalidDictionary as error:  # checked before (read_entries): a second line of defence
        raise DeepLError(400, f"Invalid glossary entries provided: {error}.") from None
    except StoreUnavailable as error:  # the driver's reason is for the operator, not the client
        log.warning("glossary store unavailable: %s", error)
        message = "Glossaries are unavailable: the database did not answer; retry later."
        raise DeepLError(503, message, {"Retry-After": "1"}) from None


# --- answers ---------------------------------------------------------------------------------


def _time(moment: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and Z, as DeepL writes it (and its clients parse)."""
    if moment.tzinfo is None:  # SQLite keeps no offset: the store writes UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _dictionary_view(info: DictionaryInfo) -> dict[str, Any]:
    return {
        "source_lang": info.source_lang,
        "target_lang": info.target_lang,
        "entry_count": info.entry_count,
    }


def _v3_view(info: GlossaryInfo) -> dict[str, Any]:
    return {
        "glossary_id": info.glossary_id,
        "name": info.name,
        "dictionaries": [_dictionary_view(d) for d in info.dictionaries],
        "creation_time": _time(info.creation_time),
    }


def _v2_view(info: GlossaryInfo) -> dict[str, Any]:
    (pair,) = info.dictionaries
    return {
        "glossary_id": info.glossary_id,
        "name": info.name,
        "ready": True,  # written in one transaction: usable once created
        "source_lang": pair.source_lang,
        "target_lang": pair.target_lang,
        "creation_time": _time(info.creation_time),
        "entry_count": pair.entry_count,
    }


def _one_pair(info: GlossaryInfo) -> None:
    """A v2 glossary has one dictionary; a v3 glossary of several (or none) is v3's to read."""
    if len(info.dictionaries) != 1:
        raise _not_one_pair(info.glossary_id, len(info.dictionaries))


def _not_one_pair(glossary_id: str, count: int) -> DeepLError:
    return DeepLError(
        400, f"This glossary has {count} dictionaries: read it with /v3/glossaries/{glossary_id}."
    )


def _pair_of(info: GlossaryInfo, source: str, target: str) -> DictionaryInfo:
    for dictionary in info.dictionaries:
        if (dictionary.source_lang, dictionary.target_lang) == (source, target):
            return dictionary
    raise DeepLError(404, NO_DICTIONARY)  # deleted in between by another request


def _accepts_tsv(accept: str | None) -> bool:
    """An Accept header that lets TSV through (none at all does)."""
    if not accept or not accept.strip():
        return True
    for item in accept.split(","):
        kind, *parameters = (part.strip() for part in item.split(";"))
        if kind.lower() not in (TSV, "text/*", "*/*"):
            continue
        quality = next((p[2:] for p in parameters if p.lower().startswith("q=")), "1")
        try:
            if float(quality) > 0:
                return True
        except ValueError:
            continue
    return False


class TsvResponse(Response):
    media_type = TSV


def _tsv_response(entries: tuple[tuple[str, str], ...]) -> Response:
    return Response(write_tsv(entries), media_type=f"{TSV}; charset=utf-8")


GLOSSARY_ERRORS = {
    **DEEPL_ERRORS,
    400: "a missing or unsupported field, an unsupported language pair, or entries that break "
    "DeepL's rules (the message names the line)",
    404: "no such glossary (or dictionary) for this key",
    413: "more entries than NMT_MAX_GLOSSARY_ENTRIES, entries larger than "
    "NMT_MAX_GLOSSARY_BYTES, or a body past the limit",
    415: "entries asked in a format other than text/tab-separated-values",
    503: "models loading (no language pair known yet), or the database not answering",
}
