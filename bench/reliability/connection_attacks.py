"""Attacks on connections, before a request reaches a route (issue 31, failures 2, 3 and 6),
each against a fresh server of one checkout or another (`--tree`), so that the code before a
change and after it are measured by the same script:

* idle: hold `connections` TCP connections that never send a byte, and meanwhile probe
  `/healthz` and send a translation every `interval` seconds, each on a new connection;
* slow bodies: `connections` requests announce a `Content-Length: 100000` body and send a byte
  every 5 s; meanwhile the same probes and translations;
* big headers: `connections` connections each send 10 MB of a header that never ends, then
  one request with a 30 MB header; the server's RSS before, at its peak and after.

Every probe's answer is counted by status (None: no HTTP answer within 10 s).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness import ROOT, Server, running_server
from bench.reliability.report import table_head
from bench.reliability.traffic import translate_body

PROBE_TIMEOUT = 10.0


def _host_port(server: Server) -> tuple[str, int]:
    url = httpx.URL(server.url)
    return url.host, url.port or 80


# Where the legitimate clients connect from when the attacker's address is capped
# (NMT_MAX_CONNECTIONS_PER_CLIENT): another loopback address than the attacker's 127.0.0.1.
OTHER_CLIENT = "127.0.0.2"


async def _probe(host: str, port: int, request: bytes, source: str | None = None) -> int | None:
    """One request on a new connection (from `source`); its status, or None without an HTTP
    answer."""
    local = (source, 0) if source else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=local), PROBE_TIMEOUT
        )
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), PROBE_TIMEOUT)
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()


def _requests(host: str, port: int) -> dict[str, bytes]:
    body = translate_body(1)
    return {
        "healthz": f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(),
        "translate": (
            f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
    }


async def _probe_for(
    host: str, port: int, seconds: float, interval: float, source: str | None
) -> dict[str, Counter]:
    """Probes and translations every `interval` s for `seconds`, by status."""
    requests = _requests(host, port)
    counts: dict[str, Counter] = {kind: Counter() for kind in requests}
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        results = await asyncio.gather(*(_probe(host, port, r, source) for r in requests.values()))
        for kind, status in zip(requests, results, strict=True):
            counts[kind][str(status)] += 1
        await asyncio.sleep(interval)
    return counts


async def _idle(
    host: str, port: int, connections: int, seconds: float, interval: float, source: str | None
) -> dict:
    held = []
    for _ in range(connections):
        try:
            held.append(await asyncio.open_connection(host, port))
        except OSError:
            break
    try:
        counts = await _probe_for(host, port, seconds, interval, source)
    finally:
        for _, writer in held:
            writer.close()
    return {"held": len(held), **{kind: dict(c) for kind, c in counts.items()}}


async def _slow_bodies(
    host: str, port: int, connections: int, seconds: float, interval: float, source: str | None
) -> dict:
    head = (
        f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000\r\n\r\n{"
    ).encode()
    writers = []
    for _ in range(connections):
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            break
        writer.write(head)
        writers.append(writer)

    async def trickle() -> None:
        while True:
            await asyncio.sleep(5)
            for writer in writers:
                if not writer.is_closing():
                    writer.write(b" ")

    dripping = asyncio.create_task(trickle())
    await asyncio.sleep(0.5)  # every slow request has sent its headers
    try:
        counts = await _probe_for(host, port, seconds, interval, source)
    finally:
        dripping.cancel()
        for writer in writers:
            writer.close()
    return {"held": len(writers), **{kind: dict(c) for kind, c in counts.items()}}


async def _big_headers(host: str, port: int, server: Server, connections: int) -> dict:
    before = server.rss_bytes()

    async def endless() -> int:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            return 0
        sent = 0
        try:
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Big: ".encode())
            chunk = b"a" * 65536
            while sent < 10_000_000:
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), PROBE_TIMEOUT)
                sent += len(chunk)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()
        return sent

    sent = await asyncio.gather(*(endless() for _ in range(connections)))
    huge = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Big: {'a' * 30_000_000}\r\n\r\n"
    status = await _probe(host, port, huge.encode())
    await asyncio.sleep(1)
    return {
        "connections": connections,
        "mb_sent_per_connection_median": round(sorted(sent)[len(sent) // 2] / 1e6, 2),
        "rss_mib_before": round(before / 2**20),
        "rss_mib_peak": round(server.peak_rss_bytes() / 2**20),
        "rss_mib_after": round(server.rss_bytes() / 2**20),
        "status_of_a_30_mb_header": status,
        "healthz_after": await _probe(host, port, _requests(host, port)["healthz"]),
    }


def run_connection_attacks(
    model_dir: Path,
    work_dir: Path,
    tree: Path = ROOT,
    seconds: float = 30.0,
    interval: float = 0.5,
    idle_connections: int = 1100,
    slow_connections: int = 256,
    header_connections: int = 40,
    per_client_cap: int = 0,
) -> dict[str, Any]:
    """The three attacks; with `per_client_cap`, the attacker's address is capped and the
    legitimate clients come from another one (the big-header attack is then skipped)."""
    results: dict[str, Any] = {
        "tree": str(tree), "seconds": seconds, "interval_s": interval, "cap": per_client_cap
    }  # fmt: skip
    source = OTHER_CLIENT if per_client_cap else None
    settings = {"max_connections_per_client": per_client_cap} if per_client_cap else {}

    def against_a_fresh_server(name: str, attack: Callable[[str, int, Server], Any]) -> None:
        with running_server(model_dir, work_dir / name, tree=tree, **settings) as server:
            results[name] = asyncio.run(attack(*_host_port(server), server))

    against_a_fresh_server(
        "idle", lambda h, p, _: _idle(h, p, idle_connections, seconds, interval, source)
    )
    against_a_fresh_server(
        "slow_bodies",
        lambda h, p, _: _slow_bodies(h, p, slow_connections, seconds, interval, source),
    )
    if not per_client_cap:
        against_a_fresh_server(
            "big_headers", lambda h, p, server: _big_headers(h, p, server, header_connections)
        )
    return results


def _share(counts: dict[str, int], status: str = "200") -> str:
    total = sum(counts.values())
    return f"{counts.get(status, 0)} of {total}"


COLUMNS = [
    "code",
    "idle: `/healthz` 200",
    "idle: translations 200",
    "slow bodies: `/healthz` 200",
    "slow bodies: translations 200",
    "big headers: RSS before / peak / after",
    "a 30 MB header",
]


CAPPED = 64  # NMT_MAX_CONNECTIONS_PER_CLIENT in the third run


def run_compared(model_dir: Path, work_dir: Path, before_tree: Path) -> dict[str, Any]:
    """The attacks against the code of `before_tree`, then against this checkout's, with the
    defaults and then with the attacker's address capped."""
    return {
        "before": run_connection_attacks(model_dir, work_dir / "before", tree=before_tree),
        "after": run_connection_attacks(model_dir, work_dir / "after"),
        "after_capped": run_connection_attacks(
            model_dir, work_dir / "capped", per_client_cap=CAPPED
        ),
    }


def markdown(result: dict[str, Any]) -> str:
    before, after = result["before"], result["after"]
    command = f".venv/bin/python -m bench.reliability connections --before-tree {before['tree']}"
    runs = [("before", before), ("after", after)]
    if "after_capped" in result:
        runs.append((f"after, `NMT_MAX_CONNECTIONS_PER_CLIENT={CAPPED}`", result["after_capped"]))
    rows = []
    for name, run in runs:
        idle, slow, big = run["idle"], run["slow_bodies"], run.get("big_headers")
        headers = (
            f"| {big['rss_mib_before']} / {big['rss_mib_peak']} / {big['rss_mib_after']} "
            f"| {big['status_of_a_30_mb_header']} |"
            if big
            else "| | |"
        )
        rows.append(
            f"| {name} | {_share(idle['healthz'])} | {_share(idle['translate'])} "
            f"| {_share(slow['healthz'])} | {_share(slow['translate'])} {headers}"
        )
    idle, slow, big = after["idle"], after["slow_bodies"], after["big_headers"]
    detail = "\n".join(
        f"- {name}: idle {run['idle']}; slow bodies {run['slow_bodies']}"
        + (f"; big headers {run['big_headers']}" if "big_headers" in run else "")
        for name, run in runs
    )
    return f"""## Connections: idle, slow bodies, big headers (before and after)

```sh
{command}
```

Default settings. Idle: {idle["held"]} connections that send nothing, held for
{after["seconds"]:g} s. Slow bodies: {slow["held"]} requests announcing a 100,000-byte body and
sending a byte every 5 s. Meanwhile, every {after["interval_s"]:g} s, a `GET /healthz` and a
one-sentence translation, each on a new connection (answered 200, out of those sent). Big
headers: {big["connections"]} connections each sending up to 10 MB of a header that never
ends, then one request with a 30 MB header; the server's RSS in MiB. The third run caps the
attacker's address (127.0.0.1) and sends the legitimate requests from {OTHER_CLIENT}.

{table_head(COLUMNS)}
{chr(10).join(rows)}

A 30 MB header "None": the client read no answer. The server answers 431 and closes once
NMT_MAX_HEADER_BYTES have arrived, while this client is still writing, so its connection is
reset before it reads (tests/http/test_connections.py reads that 431 from a client that stops).

Every status counted (None: no HTTP answer within {PROBE_TIMEOUT:g} s):
{detail}
"""
