"""Run every benchmark module and print its rows as ratios measured in this one run.

Not a test: timings depend on the machine. Each ``benchmarks/bench_*.py`` exposes ``run() -> list[dict]``
with keys ``name``, ``ns_per_op``, ``baseline_ns`` (optional), ``ratio`` (optional) and ``target``.
The modules that need Django configure their own minimal settings (or use ``DJANGO_SETTINGS_MODULE``
if the caller set one that loads); this runner sets none.

    python benchmarks/run.py            # everything
    python benchmarks/run.py ratelimiter bulkhead
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else ("" if value is None else str(value))


def main(argv: list[str]) -> int:
    wanted = set(argv)
    modules = sorted(p.stem for p in HERE.glob("bench_*.py"))
    print(f"{'benchmark':58} {'ns/op':>10} {'baseline':>10} {'ratio':>7}  target")
    for module_name in modules:
        short = module_name.removeprefix("bench_")
        if wanted and short not in wanted:
            continue
        module = importlib.import_module(module_name)
        for row in module.run():
            print(
                f"{row['name'][:58]:58} {_fmt(row.get('ns_per_op'), '10.1f'):>10} "
                f"{_fmt(row.get('baseline_ns'), '10.1f'):>10} {_fmt(row.get('ratio'), '7.2f'):>7}  {row.get('target', '')}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
