"""The three rate-limit algorithms on the same traffic (docs/algorithms.md), on the fake clock: deterministic.

    python benchmarks/sim_algorithms.py                                   # the table of docs/algorithms.md
    python benchmarks/sim_algorithms.py --plot docs/algorithms.png       # and the plot (needs matplotlib:
                                                                          # pip install 'django-ratelimit-r4[sim]')

Ten per second. The traffic: a burst of 12 requests at 0.95 s and another 12 at 1.05 s (either side of the cycle
limiter's boundary at 1 s), then one request every 25 ms (40/s, four times the rate) until 3 s. Each limiter
(``cycle``, ``gcra`` with its default burst of 10 and with burst 1, ``sliding_window``) sees exactly these
arrivals on its own :class:`~django_ratelimit_r4.core.clock.FakeClock`; the plot shows, for each, when requests
were let through (cumulative) and how many were let through in the second before each instant: the quantity
"10 per second" is about. ``tests/test_docs_algorithms.py`` checks that this prints the page's table.
"""

from __future__ import annotations

import argparse

from django_ratelimit_r4.core.clock import FakeClock
from django_ratelimit_r4.core.ratelimiter import RateLimiter, RateLimiterConfig

MS = 1_000_000
LIMIT, PERIOD_MS = 10, 1000
#: Arrival times (ms): 12 at 0.95 s, 12 at 1.05 s, then one every 25 ms until 3 s.
ARRIVALS = [950] * 12 + [1050] * 12 + list(range(1075, 3000, 25))
#: label -> the limiter's extra config
VARIANTS: dict[str, dict[str, object]] = {
    "cycle": {"algorithm": "cycle"},
    "gcra, burst 10": {"algorithm": "gcra"},
    "gcra, burst 1": {"algorithm": "gcra", "burst": 1},
    "sliding_window": {"algorithm": "sliding_window"},
}


def run(extra: dict[str, object], arrivals: list[int] = ARRIVALS) -> list[int]:
    """The arrival times (ms) that a limiter of 10 per second with ``extra`` config lets through."""
    clock = FakeClock(start_ns=0)
    config = RateLimiterConfig(limit_for_period=LIMIT, limit_refresh_period=f"{PERIOD_MS}ms", **extra)  # type: ignore[arg-type]
    limiter = RateLimiter("sim", config, clock=clock)
    passed = []
    for at in arrivals:
        clock.advance_ns(at * MS - clock.now_ns())
        if limiter.acquire_permission():
            passed.append(at)
    return passed


def most_in_any_window(times: list[int], window_ms: int = PERIOD_MS) -> int:
    """The most of ``times`` in any half-open window of ``window_ms`` (it suffices to start one at each time)."""
    return max((sum(1 for t in times if start <= t < start + window_ms) for start in times), default=0)


def results() -> dict[str, list[int]]:
    return {name: run(extra) for name, extra in VARIANTS.items()}


def table(runs: dict[str, list[int]]) -> str:
    """docs/algorithms.md's table: let through per 200 ms from 0.8 s, the total, the most in any second."""
    lines = []
    for name, passed in runs.items():
        per_200ms = [sum(1 for t in passed if s <= t < s + 200) for s in range(800, 3000, 200)]
        cells = " ".join(f"{n:2}" for n in per_200ms)
        lines.append(f"{name:14} {cells} | {len(passed):2} | {most_in_any_window(passed):2}")
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[int]], path: str) -> None:
    """Two panels: cumulative requests let through (and offered), and the number let through in the trailing
    second at each instant against the limit (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), dpi=100, sharex=True)
    end = 3000
    offered = sorted(ARRIVALS)
    top.step([0, *offered, end], [0, *range(1, len(offered) + 1), len(offered)], where="post", color="grey",
             linestyle=":", label="offered")
    styles = {"cycle": "-", "gcra, burst 10": "-", "gcra, burst 1": "--", "sliding_window": "-."}
    for name, passed in runs.items():
        top.step([0, *passed, end], [0, *range(1, len(passed) + 1), len(passed)], where="post",
                 linestyle=styles[name], linewidth=1.6, label=f"{name} ({len(passed)} let through)")
        xs = list(range(0, end + 1, 5))
        trailing = [sum(1 for t in passed if x - PERIOD_MS < t <= x) for x in xs]
        bottom.step(xs, trailing, where="post", linestyle=styles[name], linewidth=1.6,
                    label=f"{name} (most in any second: {most_in_any_window(passed)})")
    for ax in (top, bottom):
        ax.axvline(1000, color="black", linewidth=0.8, alpha=0.4)
        ax.grid(alpha=0.25)
    top.text(1010, 5, "cycle boundary (1 s)", fontsize=8, alpha=0.7)
    top.set_ylabel("requests (cumulative; offered: 101)")
    top.set_ylim(0, 45)
    top.set_title("10 per second, same traffic: 12 at 0.95 s, 12 at 1.05 s, then one every 25 ms (FakeClock)")
    top.legend(fontsize=8, loc="upper left")
    bottom.axhline(LIMIT, color="red", linewidth=1, alpha=0.6)
    bottom.text(2300, LIMIT + 0.5, "the limit: 10", fontsize=8, color="red")
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("let through in the last second")
    bottom.set_xlabel("time (ms)")
    bottom.set_ylim(0, 22)
    bottom.set_xlim(800, end)
    bottom.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Print the table; with ``--plot PATH`` also write the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", metavar="PATH", help="write the plot (PNG) here; needs matplotlib")
    args = parser.parse_args(argv)
    runs = results()
    print(table(runs), end="")
    if args.plot:
        plot(runs, args.plot)
        print(f"\nplot written to {args.plot}")


if __name__ == "__main__":
    main()
