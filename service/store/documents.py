"""Document jobs: an upload, its status, its translated chunks and its result, kept in the store
so that any replica answers a status poll or a download, and a job whose worker died is taken
over by another (or by the same server, restarted).

A job's life: `queued` (uploaded) -> `translating` (a worker holds its lease) -> `done` (the
result is stored) -> `downloaded` (DeepL's result is given once, then deleted); or `error`, with
a message. A worker claims a job with a lease it renews at every chunk; a lease that runs out
(its worker died, or hung) lets another worker claim the job, which goes on after the last chunk
written. The queue is first come, first served, but a worker that held a job for its turn
(NMT_DOCUMENT_TURN_SECONDS) while others waited gives it back to the end of the queue, its
chunks kept: one long file does not hold every other upload behind it. Claims are one
transaction each: on PostgreSQL `FOR UPDATE SKIP LOCKED`, so that two
workers never take the same job nor wait on each other; on SQLite the write lock that every
write transaction takes first (database.py) does the same for the one server it serves.

The document key is the job's secret (DeepL's `document_key`): only its hash is kept, and a
wrong key reads as a job that does not exist.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, and_, delete, insert, or_, select, update

from service.store.schema import document_chunks, document_files, document_jobs

if TYPE_CHECKING:
    from service.store.database import Database

# A job claimed this many times without finishing is failed: its file kills workers.
MAX_ATTEMPTS = 3


class DocumentNotFound(Exception):
    """No job of that id with that key (or it expired, or its result was downloaded)."""


class DocumentNotReady(Exception):
    """The job exists but has no result (yet): DeepL's 503 for a download."""

    def __init__(self, status: str) -> None:
        super().__init__(f"the document is {status}")
        self.status = status


@dataclass(frozen=True)
class NewDocument:
    """What an upload stores: the file, what it is and what to do with it."""

    owner: str
    filename: str  # of the result, as it is offered for download
    format: str
    source_lang: str
    target_lang: str
    glossary_id: str | None
    options: dict[str, Any]  # JSON-able: the search options asked for
    segments: int
    characters: int
    data: bytes


@dataclass(frozen=True)
class DocumentStatus:
    document_id: str
    status: str
    filename: str
    segments: int
    segments_done: int
    characters: int
    seconds_remaining: int | None
    error_message: str | None


@dataclass(frozen=True)
class ClaimedDocument:
    """A job a worker holds: its file, and the segments translated by whoever held it before."""

    document_id: str
    owner: str
    format: str
    source_lang: str
    target_lang: str
    glossary_id: str | None
    options: dict[str, Any]
    segments: int
    characters: int
    data: bytes
    done: list[str]  # translations of segments [0, len(done)), in order


def _claimable(now: datetime, passed_over: Sequence[str]) -> ColumnElement[bool]:
    """A job a worker may claim: queued, or translating under a lease that ran out; not one of
    `passed_over`."""
    claimable = or_(
        document_jobs.c.status == "queued",
        and_(document_jobs.c.status == "translating", document_jobs.c.lease_expires < now),
    )
    if passed_over:
        claimable = and_(claimable, document_jobs.c.id.not_in(list(passed_over)))
    return claimable


def _hash(key: str) -> str:
    # surrogatepass: a key holding any surrogate (a form's undecodable bytes, JSON's lone
    # "\ud800") hashes, and matches no document (their keys are hex).
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


class DocumentStore:
    """Document jobs. Each method is one transaction; synchronous (call it off the loop)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def create(self, document: NewDocument, expires_after: float) -> tuple[str, str]:
        """Store an upload as a queued job; returns (document_id, document_key)."""
        document_id = uuid.uuid4().hex.upper()
        key = secrets.token_hex(32).upper()
        now = _now()
        with self.database.write() as connection:
            connection.execute(
                insert(document_jobs).values(
                    id=document_id,
                    key_hash=_hash(key),
                    owner=document.owner,
                    status="queued",
                    filename=document.filename,
                    format=document.format,
                    source_lang=document.source_lang,
                    target_lang=document.target_lang,
                    glossary_id=document.glossary_id,
                    options=json.dumps(document.options),
                    segments=document.segments,
                    segments_done=0,
                    characters=document.characters,
                    attempts=0,
                    created=now,
                    expires=now + timedelta(seconds=expires_after),
                    queued_since=now,
                )
            )
            connection.execute(
                insert(document_files).values(job_id=document_id, kind="input", data=document.data)
            )
        return document_id, key

    def status(self, document_id: str, key: str) -> DocumentStatus:
        with self.database.read() as connection:
            row = self._row(connection, document_id, key)
        return DocumentStatus(
            row.id,
            row.status,
            row.filename,
            row.segments,
            row.segments_done,
            row.characters,
            row.seconds_remaining,
            row.error_message,
        )

    def result(self, document_id: str, key: str, once: bool) -> tuple[str, bytes]:
        """The translated file (its name and bytes). With `once` (DeepL), the result is deleted
        as it is read and the job marked `downloaded`: a second download is DocumentNotFound."""
        with self.database.write() as connection:
            row = self._row(connection, document_id, key)
            if row.status == "downloaded":
                raise DocumentNotFound(document_id)
            if row.status != "done":
                raise DocumentNotReady(row.status)
            data = connection.execute(
                select(document_files.c.data).where(
                    document_files.c.job_id == document_id, document_files.c.kind == "output"
                )
            ).scalar_one()
            if once:
                connection.execute(
                    delete(document_files).where(document_files.c.job_id == document_id)
                )
                connection.execute(
                    update(document_jobs)
                    .where(document_jobs.c.id == document_id)
                    .values(status="downloaded")
                )
        return row.filename, data

    def claim(
        self, worker: str, lease_seconds: float, passed_over: Sequence[str] = ()
    ) -> ClaimedDocument | None:
        """The job queued longest (since its upload, or since a worker gave it up for its turn),
        or one translating under a lease that ran out, now held by `worker`; None when there is
        none. `passed_over`: ids of jobs not to claim (their pair is not served here now)."""
        now = _now()
        with self.database.write() as connection:
            row = connection.execute(
                select(document_jobs)
                .where(_claimable(now, passed_over))
                .order_by(document_jobs.c.queued_since)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            if row.attempts >= MAX_ATTEMPTS:
                self._set_error(
                    connection,
                    row.id,
                    f"translation was started {row.attempts} times and never finished",
                )
                return None
            connection.execute(
                update(document_jobs)
                .where(document_jobs.c.id == row.id)
                .values(
                    status="translating",
                    worker=worker,
                    lease_expires=now + timedelta(seconds=lease_seconds),
                    attempts=row.attempts + 1,
                )
            )
            data = connection.execute(
                select(document_files.c.data).where(
                    document_files.c.job_id == row.id, document_files.c.kind == "input"
                )
            ).scalar_one()
            chunks = connection.execute(
                select(document_chunks.c.first_segment, document_chunks.c.translations)
                .where(document_chunks.c.job_id == row.id)
                .order_by(document_chunks.c.first_segment)
            ).all()
        done: list[str] = []
        for first, translations in chunks:
            if first != len(done):  # a gap cannot happen (chunks are written in order)
                break
            done += json.loads(translations)
        return ClaimedDocument(
            row.id,
            row.owner,
            row.format,
            row.source_lang,
            row.target_lang,
            row.glossary_id,
            json.loads(row.options),
            row.segments,
            row.characters,
            data,
            done,
        )

    def save_chunk(
        self,
        document_id: str,
        worker: str,
        first_segment: int,
        translations: list[str],
        seconds_remaining: int | None,
        lease_seconds: float,
    ) -> bool:
        """Keep translated segments [first_segment, ...) and renew the lease; False when the
        worker no longer holds the job (its lease ran out and another took it, or it expired
        or was deleted): the worker then drops it."""
        with self.database.write() as connection:
            held = self._renew(connection, document_id, worker, lease_seconds)
            if not held:
                return False
            connection.execute(
                insert(document_chunks).values(
                    job_id=document_id,
                    first_segment=first_segment,
                    translations=json.dumps(translations),
                )
            )
            connection.execute(
                update(document_jobs)
                .where(document_jobs.c.id == document_id)
                .values(
                    segments_done=first_segment + len(translations),
                    seconds_remaining=seconds_remaining,
                )
            )
        return True

    def renew(self, document_id: str, worker: str, lease_seconds: float) -> bool:
        with self.database.write() as connection:
            return self._renew(connection, document_id, worker, lease_seconds)

    def finish(self, document_id: str, worker: str, data: bytes) -> bool:
        """Store the result (the job is `done`); False if the worker lost the job."""
        with self.database.write() as connection:
            if not self._renew(connection, document_id, worker, 0):
                return False
            connection.execute(
                insert(document_files).values(job_id=document_id, kind="output", data=data)
            )
            connection.execute(
                delete(document_chunks).where(document_chunks.c.job_id == document_id)
            )
            connection.execute(
                update(document_jobs)
                .where(document_jobs.c.id == document_id)
                .values(
                    status="done",
                    segments_done=document_jobs.c.segments,
                    seconds_remaining=0,
                    worker=None,
                    lease_expires=None,
                    finished=_now(),
                )
            )
        return True

    def fail(self, document_id: str, worker: str, message: str) -> bool:
        with self.database.write() as connection:
            if not self._renew(connection, document_id, worker, 0):
                return False
            self._set_error(connection, document_id, message)
        return True

    def release(self, document_id: str, worker: str, to_the_back: bool = False) -> None:
        """Give a job back to the queue (the server stops): another worker may claim it now.
        `to_the_back`: its turn is over (others were waiting), so it waits behind them."""
        values: dict[str, Any] = {
            "status": "queued",
            "worker": None,
            "lease_expires": None,
            "attempts": document_jobs.c.attempts - 1,
        }
        if to_the_back:
            values["queued_since"] = _now()
        with self.database.write() as connection:
            connection.execute(
                update(document_jobs)
                .where(
                    document_jobs.c.id == document_id,
                    document_jobs.c.worker == worker,
                    document_jobs.c.status == "translating",
                )
                .values(**values)
            )

    def others_waiting(self, document_id: str, passed_over: Sequence[str] = ()) -> bool:
        """Whether a job other than this one could be claimed now (see claim)."""
        with self.database.read() as connection:
            return (
                connection.execute(
                    select(document_jobs.c.id)
                    .where(
                        _claimable(_now(), [*passed_over, document_id]),
                    )
                    .limit(1)
                ).first()
                is not None
            )

    def expire(self) -> int:
        """Delete the jobs past their expiry, files and all; returns how many."""
        with self.database.write() as connection:
            result = connection.execute(
                delete(document_jobs).where(document_jobs.c.expires < _now())
            )
        return result.rowcount or 0

    def queued(self) -> int:
        """Jobs waiting for a worker (queued, or held under a lease that ran out)."""
        with self.database.read() as connection:
            rows = connection.execute(
                select(document_jobs.c.id).where(document_jobs.c.status == "queued")
            ).all()
        return len(rows)

    # --- within a transaction ------------------------------------------------------------

    @staticmethod
    def _row(connection: Connection, document_id: str, key: str) -> Any:
        row = connection.execute(
            select(document_jobs).where(document_jobs.c.id == str(document_id).upper())
        ).first()
        if (
            row is None
            or not hmac.compare_digest(row.key_hash, _hash(str(key).upper()))
            or row.expires < _now()
        ):
            raise DocumentNotFound(document_id)
        return row

    @staticmethod
    def _renew(connection: Connection, document_id: str, worker: str, lease_seconds: float) -> bool:
        result = connection.execute(
            update(document_jobs)
            .where(
                document_jobs.c.id == document_id,
                document_jobs.c.worker == worker,
                document_jobs.c.status == "translating",
            )
            .values(lease_expires=_now() + timedelta(seconds=lease_seconds))
        )
        return bool(result.rowcount)

    @staticmethod
    def _set_error(connection: Connection, document_id: str, message: str) -> None:
        connection.execute(delete(document_files).where(document_files.c.job_id == document_id))
        connection.execute(delete(document_chunks).where(document_chunks.c.job_id == document_id))
        connection.execute(
            update(document_jobs)
            .where(document_jobs.c.id == document_id)
            .values(
                status="error",
                error_message=message,
                worker=None,
                lease_expires=None,
                seconds_remaining=None,
                finished=_now(),
            )
        )
