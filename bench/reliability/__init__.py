"""The reliability harness of issue 9: fuzzing, hostile input, overload, SIGTERM and a soak, each
against its own `nmt serve` process on a free loopback port.

    .venv/bin/python -m bench.reliability {schemathesis,hostile,overload,sigterm,soak,all} ...

Every subcommand prints and returns a result dict with a "nothing lost" count (every request sent
got exactly one HTTP answer) and writes its own section of docs/reliability.md. Timings on a
2-core machine shared with the load generator are noisy: they are reported, never asserted here;
tests/bench/test_reliability.py asserts only what a correct server guarantees on any CPU.
"""
