"""Document jobs: an upload stored as a job, translated by a worker a chunk at a time, its
status and result read back, from the store, by whichever replica a client reaches.

One worker per NMT_DOCUMENT_WORKERS runs on the server's event loop. It claims the oldest job
(service/store/documents.py: a lease), reads the file again, and queues its sentences a chunk
at a time (NMT_DOCUMENT_CHUNK_SENTENCES) as background work: the decoding loop takes them only
into the room interactive requests leave (service/serving/queue.py). Each chunk's translations
are kept in the store as it finishes, with the lease renewed (and renewed while a chunk runs,
every third of the lease: one long paragraph is one chunk); a worker that takes over a job
whose worker died starts after the last chunk kept. When all are done the file is written and
stored; a file that cannot be translated ends the job in `error` with the reason.

A job is not lost to the server's own state: if its pair's model is unloaded (or being loaded
again) it goes back to the queue, chunks kept, and this server's workers pass it over until a
model serves its pair again (a replica that serves it may take it meanwhile); if the server
stops, or its drain runs out while a chunk is in the loop, it goes back to the queue for
whoever comes next.

Everything CPU-bound (reading and writing files, the markup layout) runs on worker threads,
every store call too: the event loop only waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, replace

from service.documents import markup
from service.documents.collection import collector_paused
from service.documents.files import Upload, limits_of, read_upload, reopen
from service.documents.formats import DocumentRefused, format_named
from service.runtime.search import SearchOptions
from service.serving.errors import ModelUnavailable, ServiceError, ShuttingDown, UnknownPair
from service.serving.requests import TranslationService
from service.serving.settings import Settings
from service.serving.terminology import Terminology
from service.store import ClaimedDocument, DocumentStatus, NewDocument, Store, StoreUnavailable
from service.store.glossaries import DictionaryNotFound, GlossaryNotFound

log = logging.getLogger("nmt.documents")

# How often an idle worker deletes expired jobs (every this many polls).
EXPIRE_EVERY_POLLS = 60
# Characters per second assumed before any chunk was measured (for seconds_remaining).
FIRST_GUESS_CHARS_PER_SECOND = 200.0


@dataclass(frozen=True)
class DocumentRequest:
    """What an upload asks for, once its dialect has read and checked the fields."""

    filename: str | None
    source_lang: str | None  # None: detected from the file's text
    target_lang: str
    glossary_id: str | None
    output_format: str | None
    owner: str
    options: SearchOptions


@dataclass(frozen=True)
class Submitted:
    document_id: str
    document_key: str
    upload: Upload
    source_lang: str


class Throughput:
    """Characters translated per second by this server's document workers, measured on
    chunks (an exponentially weighted mean, so that it follows load), for seconds_remaining."""

    def __init__(self, weight: float = 0.3) -> None:
        self.weight = weight
        self.chars_per_second: float | None = None

    def observe(self, characters: int, seconds: float) -> None:
        if characters <= 0 or seconds <= 0:
            return
        rate = characters / seconds
        old = self.chars_per_second
        self.chars_per_second = rate if old is None else old + self.weight * (rate - old)

    def seconds_for(self, characters: int) -> int:
        rate = self.chars_per_second or FIRST_GUESS_CHARS_PER_SECOND
        return max(1, round(characters / rate)) if characters > 0 else 0


class _TurnOver(Exception):
    """A worker's turn on a job is over: the job goes to the back of the queue."""


class DocumentJobs:
    """Uploads, status, results, and this server's workers."""

    def __init__(self, settings: Settings, service: TranslationService, store: Store) -> None:
        # Workers claim jobs only while the server is ready: a job claimed while models load
        # would fail for want of a model.
        self.settings = settings
        self.service = service
        self.store = store
        self.limits = limits_of(settings)
        self.throughput = Throughput()
        self.worker_id = f"{uuid.uuid4().hex[:12]}"
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()
        # Jobs given back because no model serves their pair now: document id -> its pair.
        # Passed over by this server's workers until the pair is served again.
        self._waiting: dict[str, tuple[str, str]] = {}

    # --- the client's side -------------------------------------------------------------

    async def submit(self, data: bytes, request: DocumentRequest) -> Submitted:
        """Read and check the file (refused at once with DocumentRefused), find its source
        language if none was given, and store it as a queued job."""
        upload = await asyncio.to_thread(
            collector_paused,
            read_upload,
            data,
            request.filename,
            request.output_format,
            self.limits,
        )
        source = request.source_lang
        if source is None:
            detected = await self.service.detect_source([upload.sample], request.target_lang)
            source = detected.language
        self.service.model_for(source, request.target_lang)  # UnknownPair, NotReady: at once
        document = NewDocument(
            owner=request.owner,
            filename=upload.filename,
            format=upload.format.name,
            source_lang=source,
            target_lang=request.target_lang,
            glossary_id=request.glossary_id,
            options=asdict(request.options),
            segments=upload.segments,
            characters=upload.characters,
            data=data,
        )
        document_id, key = await self.store.threads.run(
            self.store.documents.create, document, self.settings.document_result_ttl_seconds
        )
        log.info(
            "document queued",
            extra={
                "document_id": document_id,
                "format": upload.format.name,
                "segments": upload.segments,
                "characters": upload.characters,
            },
        )
        return Submitted(document_id, key, upload, source)

    async def status(self, document_id: str, key: str) -> DocumentStatus:
        return await self.store.threads.run(self.store.documents.status, document_id, key)

    async def result(self, document_id: str, key: str, once: bool) -> tuple[str, bytes]:
        return await self.store.threads.run(self.store.documents.result, document_id, key, once)

    async def wait(self, document_id: str, key: str, timeout: float) -> DocumentStatus:
        """Poll until the job is done or failed (LibreTranslate's /translate_file answers when
        the file is translated); the last status when `timeout` runs out."""
        deadline = time.monotonic() + timeout
        while True:
            status = await self.status(document_id, key)
            if status.status in ("done", "downloaded", "error") or time.monotonic() > deadline:
                return status
            await asyncio.sleep(min(0.2, self.settings.document_poll_seconds))

    # --- the workers ---------------------------------------------------------------------

    def start(self) -> None:
        for number in range(self.settings.document_workers):
            self._tasks.append(asyncio.create_task(self._work(f"{self.worker_id}-{number}")))

    async def stop(self) -> None:
        """Stop the workers; the jobs they held go back to the queue for whoever comes next."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _work(self, worker: str) -> None:
        polls = 0
        while not self._stopping.is_set():
            if not self.service.lifecycle.ready:
                await self._pause()
                continue
            try:
                if polls % EXPIRE_EVERY_POLLS == 0:
                    await self.store.threads.run_unbounded(self.store.documents.expire)
                polls += 1
                # (Each pair asked once: many jobs may wait for one model.)
                served = {pair: self._serves(*pair) for pair in set(self._waiting.values())}
                waiting = self._waiting.items()
                self._waiting = {job: pair for job, pair in waiting if not served[pair]}
                job = await self.store.threads.run_unbounded(
                    self.store.documents.claim,
                    worker,
                    self.settings.document_lease_seconds,
                    list(self._waiting),
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # the database is away: try again at the next poll
                log.exception("document worker could not reach the store")
                job = None
            if job is None:
                await self._pause()
                continue
            await self._translate_held(worker, job)

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.settings.document_poll_seconds)

    def _serves(self, source_lang: str, target_lang: str) -> bool:
        try:
            self.service.model_for(source_lang, target_lang)
        except ServiceError:
            return False
        return True

    async def _release(self, worker: str, job: ClaimedDocument, to_the_back: bool = False) -> None:
        """The job back to the queue, its chunks kept, for whoever claims it next."""
        release = self.store.documents.release
        with contextlib.suppress(Exception):
            await asyncio.shield(
                self.store.threads.run(release, job.document_id, worker, to_the_back)
            )

    async def _translate_held(self, worker: str, job: ClaimedDocument) -> None:
        try:
            await self._translate(worker, job)
        except asyncio.CancelledError:  # the server stops: someone else takes it from here
            await self._release(worker, job)
            raise
        except _TurnOver:  # others waited: behind them, its chunks kept
            log.info("document gives up its turn", extra=_ids(job))
            await self._release(worker, job, to_the_back=True)
        except ShuttingDown:  # the drain ran out with a chunk in the loop: the same
            log.info("document given back: the server stops", extra=_ids(job))
            await self._release(worker, job)
        except StoreUnavailable as error:  # nothing to write its failure to, nor a failure
            log.warning("document paused: the store is unavailable (%s)", error, extra=_ids(job))
            await self._release(worker, job)  # (or, if that fails too, its lease runs out)
        except (UnknownPair, ModelUnavailable) as error:  # its model went away, for now
            log.info("document waits for its model", extra={**_ids(job), "reason": str(error)})
            self._waiting[job.document_id] = (job.source_lang, job.target_lang)
            await self._release(worker, job)
        except (DocumentRefused, ServiceError) as error:
            reason = getattr(error, "reason", None) or str(error)
            await self._fail(worker, job, reason)
        except Exception:
            log.exception("document translation failed", extra={"document_id": job.document_id})
            await self._fail(worker, job, "the server failed to translate this document")

    async def _fail(self, worker: str, job: ClaimedDocument, reason: str) -> None:
        log.info("document failed", extra={"document_id": job.document_id, "reason": reason})
        with contextlib.suppress(Exception):
            await self.store.threads.run(self.store.documents.fail, job.document_id, worker, reason)
        self._observe(job, "error")

    def _observe(self, job: ClaimedDocument, outcome: str) -> None:
        if self.service.metrics is not None:
            self.service.metrics.observe_document(job.format, outcome, job.characters)

    async def _translate(self, worker: str, job: ClaimedDocument) -> None:
        extracted = await asyncio.to_thread(
            collector_paused, reopen, job.format, job.data, self.limits
        )
        layout = format_named(job.format).markup
        # Each segment's sentences and characters; each chunk lays its segments out again when
        # it comes. The layouts of a whole long document are millions of objects (a 12 MB page:
        # 1.9 million, hundreds of MB), which the cycle collector would walk, holding the GIL.
        measures = await asyncio.to_thread(collector_paused, _measured, extracted.segments, layout)
        model = self.service.model_for(job.source_lang, job.target_lang)
        terminology = await self._terminology(job)
        # The first token is the model's for this pair (a multilingual model's target
        # language), whatever the upload's options were made with before detection.
        options = replace(
            SearchOptions(**job.options), alignment=True, n_best=1, first_token=model.first_token
        )
        done = list(job.done)
        if done:
            log.info(
                "document taken over",
                extra={"document_id": job.document_id, "resumed_at": len(done)},
            )
        sentences = [count for count, _ in measures]
        sizes = [characters for _, characters in measures]
        lease = self.settings.document_lease_seconds
        turn_ends = time.monotonic() + self.settings.document_turn_seconds
        for first, last in _chunks(sentences, len(done), self.settings.document_chunk_sentences):
            if first > len(job.done) and await self._turn_over(job, turn_ends):
                raise _TurnOver
            started = time.monotonic()
            documents = await asyncio.to_thread(
                collector_paused, markup.read, extracted.segments[first:last], layout
            )
            async with self._lease_kept(job, worker):
                result = await markup.translate(
                    self.service,
                    model,
                    documents,
                    options,
                    terminology=terminology,
                    background=True,
                )
            characters = sum(sizes[first:last])
            self.throughput.observe(characters, time.monotonic() - started)
            remaining = self.throughput.seconds_for(sum(sizes[last:]))
            kept = await self.store.threads.run_unbounded(
                self.store.documents.save_chunk,
                job.document_id,
                worker,
                first,
                result.texts,
                remaining,
                lease,
            )
            if not kept:  # the lease ran out and another worker took the job, or it expired
                log.info("document lost to another worker", extra={"document_id": job.document_id})
                return
            done += result.texts
        extracted.target_language = job.target_lang
        data = await asyncio.to_thread(collector_paused, extracted.write, done)
        if await self.store.threads.run_unbounded(
            self.store.documents.finish, job.document_id, worker, data
        ):
            self._observe(job, "done")
        log.info("document done", extra={"document_id": job.document_id, "bytes": len(data)})

    async def _turn_over(self, job: ClaimedDocument, turn_ends: float) -> bool:
        """Whether the job's turn is over: it has been translated for NMT_DOCUMENT_TURN_SECONDS
        and another job waits (one this server can translate now)."""
        if not self.settings.document_turn_seconds or time.monotonic() < turn_ends:
            return False
        return await self.store.threads.run_unbounded(
            self.store.documents.others_waiting, job.document_id, list(self._waiting)
        )

    @contextlib.asynccontextmanager
    async def _lease_kept(self, job: ClaimedDocument, worker: str) -> AsyncIterator[None]:
        """The job's lease renewed every third of its length while the block runs: a chunk
        that takes longer than the lease (a long paragraph, or documents starved by
        interactive requests) is not claimed by another worker meanwhile, translated twice,
        and counted as a failed attempt."""
        lease = self.settings.document_lease_seconds

        async def renew() -> None:
            while True:
                await asyncio.sleep(lease / 3)
                with contextlib.suppress(Exception):  # (the store away: the next try, or the end)
                    await self.store.threads.run(
                        self.store.documents.renew, job.document_id, worker, lease
                    )

        renewing = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing

    async def _terminology(self, job: ClaimedDocument) -> Terminology | None:
        if not job.glossary_id:
            return None
        try:
            dictionary = await self.store.threads.run_unbounded(
                self.store.glossaries.dictionary,
                job.owner,
                job.glossary_id,
                job.source_lang,
                job.target_lang,
            )
        except (GlossaryNotFound, DictionaryNotFound):
            raise DocumentRefused(
                f"glossary {job.glossary_id} was deleted, or has no dictionary for "
                f"{job.source_lang}->{job.target_lang}"
            ) from None
        return await asyncio.to_thread(Terminology, dictionary.entries)


def _ids(job: ClaimedDocument) -> dict[str, str]:
    return {"document_id": job.document_id}


def _measured(segments: list[str], layout: markup.MarkupOptions) -> list[tuple[int, int]]:
    """Each segment's model sentences and plain-text characters, laid out one at a time."""
    measures = []
    for segment in segments:
        (document,) = markup.read([segment], layout)
        measures.append((len(document.model_sentences), len(document.plain_text)))
    return measures


def _chunks(sentences: Sequence[int], start: int, per_chunk: int) -> list[tuple[int, int]]:
    """[first, last) segment ranges from `start` on, each holding about `per_chunk` model
    sentences (`sentences`: each segment's; a segment is never cut, one with more is a chunk
    of its own)."""
    ranges: list[tuple[int, int]] = []
    first, count = start, 0
    for index in range(start, len(sentences)):
        count += sentences[index]
        if count >= per_chunk:
            ranges.append((first, index + 1))
            first, count = index + 1, 0
    if first < len(sentences):
        ranges.append((first, len(sentences)))
    return ranges
