"""The scenario mix of the load test: names and weights, parsed from `--mix` / LOADTEST_MIX.

Kept apart from locustfile.py (which imports Locust) so that tests can check it in-process.
"""

from __future__ import annotations

SCENARIOS = ("short", "paragraph", "list", "libre")
DEFAULT_MIX = "short=6,paragraph=2,list=1,libre=1"


def parse_mix(text: str) -> dict[str, float]:
    """'short=6,list=1' -> {'short': 6.0, 'list': 1.0}; unknown names or no weight are errors."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r} in --mix (known: {', '.join(SCENARIOS)})")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"{item!r} in --mix: the weight must be a number") from None
    if not any(weight > 0 for weight in weights.values()):
        raise ValueError(f"--mix {text!r} gives no scenario a positive weight")
    return weights
