"""The sweep report's PEAK THROUGHPUT card quotes a valid level only: one that never stabilised,
had failed requests or failed another check is no peak; with none valid the card says so."""

from __future__ import annotations

import html
import re

from perfkit.report.html.sweep import _kpis
from perfkit.results.model import Check, SweepResult
from tests.synthetic import make_level, make_sweep

CARD = re.compile(r'<div class="k">peak throughput</div><div class="v">([^<]*)</div><div class="s">([^<]*)</div>')


def peak_card(result: SweepResult) -> tuple[str, str]:
    match = CARD.search(_kpis(result))
    assert match is not None
    return html.unescape(match[1]), html.unescape(match[2])


def test_the_peak_is_the_best_valid_level_not_an_unstable_or_failing_one() -> None:
    result = make_sweep([
        make_level(1, [1000, 1000, 1000]),
        make_level(2, [3000, 3000, 3000], stable=False),  # never stabilised
        make_level(3, [2500, 2500, 2500], errors={"HTTP 503": 4}),  # requests failed
        make_level(4, [2200, 2200, 2200], checks=[Check("sample_count", False, "40 measured", "measure longer")]),
        make_level(5, [1500, 1500, 1500]),
    ])  # fmt: skip
    assert peak_card(result) == ("1,500.0 infer/s", "at concurrency 5, the best valid level")


def test_a_valid_peak_that_is_also_the_highest_is_quoted_plainly() -> None:
    result = make_sweep([make_level(1, [1000, 1000, 1000]), make_level(2, [1800, 1800, 1800])])
    assert peak_card(result) == ("1,800.0 infer/s", "at concurrency 2")


def test_with_no_valid_level_the_card_says_so_and_names_the_best_invalid_one_as_such() -> None:
    result = make_sweep([
        make_level(1, [1000, 1000, 1000], stable=False),
        make_level(2, [3000, 3000, 3000], errors={"HTTP 503": 4}),
    ])  # fmt: skip
    assert peak_card(result) == ("no valid level", "best invalid: 3,000.0 infer/s at concurrency 2 (errors)")
