"""docs/algorithms.md: its example prints exactly the table the page shows, and its settings pass the checks."""

from __future__ import annotations

import contextlib
import io
import re

from django_ratelimit_r4 import conf

from .test_docs_examples import ROOT, block, run

PAGE = "docs/algorithms.md"


def test_the_same_traffic_table_is_what_the_example_prints() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(block(PAGE, "arrivals = "), PAGE)
    text = (ROOT / PAGE).read_text(encoding="utf-8")
    shown = re.search(r"^```text\n(.*?)^```", text, re.S | re.M)
    assert shown is not None
    assert out.getvalue() == shown.group(1)


def test_the_plot_script_runs_the_same_traffic() -> None:
    """benchmarks/sim_algorithms.py (which draws docs/algorithms.png) prints the page's table too."""
    from benchmarks.sim_algorithms import results, table

    text = (ROOT / PAGE).read_text(encoding="utf-8")
    shown = re.search(r"^```text\n(.*?)^```", text, re.S | re.M)
    assert shown is not None
    assert table(results()) == shown.group(1)
    assert "](algorithms.png)" in text and (ROOT / "docs" / "algorithms.png").is_file()


def test_the_settings_example_passes_the_checks_and_builds_each_algorithm() -> None:
    ns = run(block(PAGE, "RATELIMIT_R4 = {"), PAGE)
    analysis = conf.analyse(ns["RATELIMIT_R4"])
    assert analysis.problems == []
    specs = analysis.specs["ratelimiters"]
    assert {name: spec.config.algorithm for name, spec in specs.items()} == {
        "search": "cycle",
        "login": "sliding_window",
        "partner": "gcra",
    }
    assert specs["partner"].config.burst == 10
