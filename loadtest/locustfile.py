"""Locust scenarios for nmt-serve: what clients of a translation service send, in proportions
you choose.

  short      one short sentence, greedy (beam_size 1): chat messages, UI strings
  paragraph  a paragraph of several sentences, beam search (beam_size 4): documents
  list       a list of 8 sentences in one request (the server's default beam): batch jobs
  libre      one sentence through the LibreTranslate route (/translate): Mastodon, Weblate

The mix is weights, `--mix short=6,paragraph=2,list=1,libre=1` or LOADTEST_MIX; the host is
Locust's `-H` or LOCUST_HOST; an API key, `--api-key` or LOADTEST_API_KEY. Every answer is
checked (status, one translation per text, none empty); anything else counts as a failure.
Run by `make loadtest` (loadtest/run.py) or:

  locust -f loadtest/locustfile.py -H http://127.0.0.1:8000
"""

from __future__ import annotations

import random
from typing import Any

from locust import HttpUser, between, events, task
from locust.argument_parser import LocustArgumentParser
from mix import DEFAULT_MIX, parse_mix
from samples import PARAGRAPHS, SHORT_SENTENCES, batch_of_texts

LIST_SIZE = 8


@events.init_command_line_parser.add_listener
def _add_options(parser: LocustArgumentParser) -> None:
    parser.add_argument(
        "--mix",
        env_var="LOADTEST_MIX",
        default=DEFAULT_MIX,
        help=f"scenario weights, e.g. {DEFAULT_MIX}",
    )
    parser.add_argument(
        "--api-key",
        env_var="LOADTEST_API_KEY",
        default="",
        is_secret=True,
        help="sent as `Authorization: Bearer KEY` (for a server with NMT_API_KEYS set)",
    )


class TranslationClient(HttpUser):
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        if options.api_key:
            self.client.headers["Authorization"] = f"Bearer {options.api_key}"
        mix = parse_mix(options.mix)
        self.scenarios = list(mix)
        self.weights = list(mix.values())
        self.rng = random.Random()

    @task
    def translate(self) -> None:
        # One task that picks a scenario, so that the mix is a run-time option.
        scenario = self.rng.choices(self.scenarios, weights=self.weights)[0]
        getattr(self, f"_{scenario}")()

    def _short(self) -> None:
        text = self.rng.choice(SHORT_SENTENCES)
        self._native("short greedy", {"text": text, "beam_size": 1}, expected=1)

    def _paragraph(self) -> None:
        text = self.rng.choice(PARAGRAPHS)
        self._native("paragraph beam 4", {"text": text, "beam_size": 4}, expected=1)

    def _list(self) -> None:
        texts = batch_of_texts(self.rng.randrange(len(SHORT_SENTENCES)), LIST_SIZE)
        self._native(f"list of {LIST_SIZE}", {"text": texts}, expected=LIST_SIZE)

    def _libre(self) -> None:
        body = {"q": self.rng.choice(SHORT_SENTENCES), "source": "fr", "target": "en"}
        with self.client.post(
            "/translate", json=body, name="/translate libre", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
            elif not response.json().get("translatedText"):
                response.failure("empty translatedText")

    def _native(self, label: str, fields: dict[str, Any], expected: int) -> None:
        body = {"source_lang": "fr", "target_lang": "en", **fields}
        with self.client.post(
            "/v1/translate", json=body, name=f"/v1/translate {label}", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
                return
            translations = response.json().get("translations", [])
            if len(translations) != expected:
                response.failure(f"{len(translations)} translations for {expected} texts")
            elif not all(item.get("text") for item in translations):
                response.failure("an empty translation")
