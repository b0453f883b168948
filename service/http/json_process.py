"""JSON bodies larger than NMT_MAX_BODY_BYTES (a glossary route's, up to 11 MiB), parsed in a
child process.

`json.loads` holds the GIL for its whole run, whatever thread calls it: 50-60 ms a MB of JSON
made of many small values (`[[], [], ...]`, `{"k0": 1, "k1": 1, ...}`), so 0.5-0.6 s for a
glossary route's 10 MB, during which the event loop stood still. A child process
(`python -m service.http.json_process`, the body on its stdin) parses such a body instead and
sends the object back, pickled, only when it holds at most MAX_VALUES values: a glossary's
entries are one string per dictionary, whatever their size, so the parent unpickles a few
strings (a copy), never millions of objects. A child costs about 50 ms to start: bodies within
NMT_MAX_BODY_BYTES are parsed in process, as before.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
from typing import Any

# Values (the top level, every object member and array item) a big body may hold. DeepL's
# glossary requests hold a few dozen.
MAX_VALUES = 10_000
# Arrays and objects within each other (DeepL's requests: 3). Deeper bodies are refused as
# unreadable: pickling one back (about 500 levels) would pass Python's recursion limit.
MAX_DEPTH = 32
# Children at once; more big bodies wait their turn (each child holds a body's copy).
MAX_CHILDREN = 2


class TooManyValues(ValueError):
    def __init__(self) -> None:
        super().__init__(f"the body holds more than {MAX_VALUES} JSON values")


def parse_bounded(body: bytes) -> Any:
    """The body's JSON; ValueError (json's own, or TooManyValues) or RecursionError."""
    data = json.loads(body)
    count, pending = 0, [(data, 0)]
    while pending:
        value, depth = pending.pop()
        count += 1
        if count > MAX_VALUES:
            raise TooManyValues
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"the body nests arrays and objects more than {MAX_DEPTH} deep")
            items = value.values() if isinstance(value, dict) else value
            pending.extend((item, depth + 1) for item in items)
    return data


class JsonProcess:
    """Parses big bodies in children, MAX_CHILDREN at a time."""

    def __init__(self) -> None:
        self._turns = asyncio.Semaphore(MAX_CHILDREN)

    async def loads(self, body: bytes) -> Any:
        """parse_bounded(body), run by a child: TooManyValues, or ValueError for JSON it could
        not read."""
        async with self._turns:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await child.communicate(body)
            except BaseException:  # the request was cancelled: the child goes with it
                child.kill()
                await child.wait()
                raise
        if child.returncode != 0:
            raise RuntimeError(f"the JSON child failed ({child.returncode}): {err[-500:]!r}")
        outcome, value = pickle.loads(out)
        if outcome == "too many values":
            raise TooManyValues
        if outcome == "refused":
            raise ValueError(value)
        return value


def _main() -> None:
    """The child: the body from stdin; ("parsed", object), ("too many values", reason) or
    ("refused", reason) to stdout."""
    body = sys.stdin.buffer.read()
    try:
        answer: tuple[str, Any] = ("parsed", parse_bounded(body))
    except TooManyValues as error:
        answer = ("too many values", str(error))
    except (ValueError, RecursionError) as error:
        answer = ("refused", str(error)[:200])
    sys.stdout.buffer.write(pickle.dumps(answer, pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _main()
