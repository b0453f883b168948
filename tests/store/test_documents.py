"""Document jobs in the store, on SQLite and on a real PostgreSQL: a job's life, the key as its
secret, leases (a job whose worker died is taken over, and resumes after its last chunk), two
workers never holding one job, one download, expiry."""

from __future__ import annotations

import threading
import time

import pytest

from service.store import DocumentNotFound, DocumentNotReady, NewDocument, Store
from service.store.documents import MAX_ATTEMPTS


def upload(
    store: Store, data: bytes = b"file", segments: int = 4, ttl: float = 60
) -> tuple[str, str]:
    document = NewDocument(
        owner="",
        filename="a.docx",
        format="docx",
        source_lang="fr",
        target_lang="en",
        glossary_id=None,
        options={"beam_size": 4},
        segments=segments,
        characters=40,
        data=data,
    )
    return store.documents.create(document, ttl)


def test_a_job_goes_from_queued_to_done_and_is_downloaded_once(store: Store):
    document_id, key = upload(store)
    assert store.documents.status(document_id, key).status == "queued"
    with pytest.raises(DocumentNotReady):
        store.documents.result(document_id, key, once=True)
    job = store.documents.claim("w1", lease_seconds=30)
    assert job is not None and job.data == b"file" and job.options == {"beam_size": 4}
    assert store.documents.status(document_id, key).status == "translating"
    assert store.documents.save_chunk(document_id, "w1", 0, ["A", "B"], 3, 30)
    status = store.documents.status(document_id, key)
    assert (status.segments_done, status.seconds_remaining) == (2, 3)
    assert store.documents.finish(document_id, "w1", b"translated")
    assert store.documents.status(document_id, key).status == "done"
    assert store.documents.result(document_id, key, once=True) == ("a.docx", b"translated")
    assert store.documents.status(document_id, key).status == "downloaded"
    with pytest.raises(DocumentNotFound):
        store.documents.result(document_id, key, once=True)


def test_a_wrong_key_reads_as_no_job(store: Store):
    document_id, key = upload(store)
    other = ("0" if key[0] != "0" else "1") + key[1:]
    for wrong in (other, "", key[:-1]):
        with pytest.raises(DocumentNotFound):
            store.documents.status(document_id, wrong)
    with pytest.raises(DocumentNotFound):
        store.documents.status("0" * 32, key)
    assert store.documents.status(document_id.lower(), key.lower()).status == "queued"


def test_a_job_whose_lease_ran_out_is_taken_over_and_resumes_after_its_last_chunk(store: Store):
    document_id, key = upload(store)
    assert store.documents.claim("dead", lease_seconds=2) is not None
    assert store.documents.save_chunk(document_id, "dead", 0, ["A", "B"], None, 2)
    assert store.documents.claim("alive", lease_seconds=30) is None  # the lease still holds
    time.sleep(2.2)
    job = store.documents.claim("alive", lease_seconds=30)
    assert job is not None and job.done == ["A", "B"]
    # The worker that lost the job can no longer write to it.
    assert not store.documents.save_chunk(document_id, "dead", 2, ["C"], None, 30)
    assert not store.documents.finish(document_id, "dead", b"x")
    assert store.documents.save_chunk(document_id, "alive", 2, ["C", "D"], 0, 30)
    assert store.documents.finish(document_id, "alive", b"done")
    assert store.documents.result(document_id, key, once=False) == ("a.docx", b"done")


def test_a_released_job_is_claimed_again_at_once(store: Store):
    upload(store)
    job = store.documents.claim("stopping", lease_seconds=300)
    assert job is not None
    store.documents.release(job.document_id, "stopping")
    again = store.documents.claim("next", lease_seconds=300)
    assert again is not None and again.document_id == job.document_id


def test_jobs_passed_over_are_left_for_later_and_the_next_one_is_claimed(store: Store):
    """A worker passes over the jobs whose pair its server does not serve now."""
    waiting, _ = upload(store)
    behind, _ = upload(store)
    job = store.documents.claim("w", lease_seconds=30, passed_over=[waiting])
    assert job is not None and job.document_id == behind
    assert store.documents.claim("w", lease_seconds=30, passed_over=[waiting]) is None
    later = store.documents.claim("w", lease_seconds=30)
    assert later is not None and later.document_id == waiting


def test_a_job_that_keeps_killing_its_workers_ends_in_error(store: Store):
    document_id, key = upload(store)
    for attempt in range(MAX_ATTEMPTS):
        assert store.documents.claim(f"w{attempt}", lease_seconds=0.01) is not None
        time.sleep(0.03)
    assert store.documents.claim("last", lease_seconds=30) is None
    status = store.documents.status(document_id, key)
    assert status.status == "error" and "never finished" in (status.error_message or "")


def test_a_failed_job_says_why_and_keeps_no_file(store: Store):
    document_id, key = upload(store)
    store.documents.claim("w", lease_seconds=30)
    assert store.documents.fail(document_id, "w", "the file is damaged")
    status = store.documents.status(document_id, key)
    assert (status.status, status.error_message) == ("error", "the file is damaged")
    with pytest.raises(DocumentNotReady):
        store.documents.result(document_id, key, once=True)


def test_expired_jobs_are_deleted(store: Store):
    old_id, old_key = upload(store, ttl=0.05)
    new_id, new_key = upload(store, ttl=60)
    time.sleep(0.1)
    with pytest.raises(DocumentNotFound):  # past its expiry it is gone to clients at once
        store.documents.status(old_id, old_key)
    assert store.documents.expire() == 1
    assert store.documents.status(new_id, new_key).status == "queued"


def test_two_workers_claiming_at_once_never_take_the_same_job(store: Store):
    for _ in range(6):
        upload(store)
    claimed: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while (job := store.documents.claim(name, lease_seconds=60)) is not None:
            with lock:
                claimed.append(job.document_id)

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claimed) == 6 and len(set(claimed)) == 6


def test_a_job_whose_turn_is_over_waits_behind_the_others(store: Store):
    """Given back `to_the_back`, a job is claimed after those queued before that moment; given
    back otherwise (the server stops), it keeps its place. Neither counts as an attempt."""
    first, _ = upload(store)
    second, _ = upload(store)
    job = store.documents.claim("w1", lease_seconds=30)
    assert job is not None and job.document_id == first
    assert store.documents.others_waiting(first)
    assert store.documents.save_chunk(first, "w1", 0, ["A"], 3, 30)
    store.documents.release(first, "w1", to_the_back=True)
    job = store.documents.claim("w1", lease_seconds=30)
    assert job is not None and job.document_id == second
    assert store.documents.others_waiting(second)
    assert not store.documents.others_waiting(second, passed_over=[first])
    store.documents.release(second, "w1")  # keeps its place, ahead of the first
    job = store.documents.claim("w1", lease_seconds=30)
    assert job is not None and job.document_id == second
    assert not store.documents.others_waiting(second, passed_over=[first])
    store.documents.release(second, "w1", to_the_back=True)
    job = store.documents.claim("w1", lease_seconds=30)
    assert job is not None and job.document_id == first and job.done == ["A"]
    assert store.documents.claim("w2", lease_seconds=30).document_id == second
    # Turns are not attempts: three of them do not fail the job.
    for _ in range(MAX_ATTEMPTS):
        store.documents.release(first, "w1", to_the_back=True)
        assert store.documents.claim("w1", lease_seconds=30).document_id == first
