"""What the library primitives cost per decision beside the hand-written ones they
replaced: admit/release cycles through ``proxy.admission.Admission``
(``asyncio.Semaphore`` and ``asyncio.timeout``) and observations into
prometheus_client's ``Histogram``, each beside its version at commit ``OLD``
(``Slots`` and one timer handle; a histogram in plain lists), read from git.

    .venv/bin/python bench/investigations/primitives.py [--cycles 100000] [--rounds 5]

Old and new take turns in every round; each figure is the best round, in
microseconds per cycle or observation, with the ratio new / old. ``contended``:
8 tasks through 4 places, each holding its place across one ``sleep(0)``. Run it
on a quiet machine, from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Histogram  # noqa: E402

from proxy.admission import Admission  # noqa: E402

OLD = "4091dfebe6c954cf801c6d24e041e2ab87c1abc7"  # the last commit with the hand-written ones
BUCKETS = (
    0.002,
    0.005,
    0.0075,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    25,
    60,
)  # proxy/metrics.py's latency buckets
VALUES = (0.004, 0.011, 0.013, 0.018, 0.03, 0.2)


def _old(path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{OLD}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def old_admission() -> type:
    """The old ``Admission``, imported from a package of its files at ``OLD``."""
    package = Path(tempfile.mkdtemp()) / "old_proxy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("admission", "slots", "errors"):
        (package / f"{name}.py").write_text(_old(f"proxy/{name}.py"))
    sys.path.insert(0, str(package.parent))
    from old_proxy.admission import Admission as OldAdmission

    shutil.rmtree(package.parent)  # imported: the files are no longer needed
    return OldAdmission


def old_histogram() -> type:
    """The old ``_Histogram``: its classes cut out of proxy/metrics.py at ``OLD``."""
    text = _old("proxy/metrics.py")
    code = text[text.index("class _Series:") : text.index("# every kind an upstream")]
    namespace: dict = {}
    exec(
        "import math\nfrom bisect import bisect_left\n"
        "from prometheus_client import CollectorRegistry\n"
        "from prometheus_client.core import HistogramMetricFamily\n"
        "from prometheus_client.utils import floatToGoString\n" + code,
        namespace,
    )
    return namespace["_Histogram"]


async def cycles(admission_class: type, n: int, tasks: int, places: int) -> float:
    admission = admission_class(max_active=places, max_queued=tasks, deadline_s=30, retry_after_s=1)

    async def one(count: int) -> None:
        for _ in range(count):
            async with admission.admit():
                if tasks > 1:
                    await asyncio.sleep(0)

    start = time.perf_counter()
    await asyncio.gather(*(one(n // tasks) for _ in range(tasks)))
    return (time.perf_counter() - start) / n * 1e6


def observations(histogram_class: type, n: int) -> float:
    h = histogram_class(
        "h_seconds",
        "doc",
        ["route", "kind", "outcome"],
        buckets=BUCKETS,
        registry=CollectorRegistry(),
    )
    child = h.labels("/v1/systemone", "decision", "ok")
    values = VALUES * (n // len(VALUES))
    start = time.perf_counter()
    for value in values:
        child.observe(value)
    return (time.perf_counter() - start) / len(values) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    try:
        import uvloop

        factory, loop_name = uvloop.new_event_loop, "uvloop"
    except ImportError:
        factory, loop_name = None, "asyncio"
    pairs = {
        "admit/release": (old_admission(), Admission),
        "histogram observe": (old_histogram(), Histogram),
    }
    best: dict[tuple[str, int], float] = {}
    with asyncio.Runner(loop_factory=factory) as runner:
        for _ in range(args.rounds):
            for which in (0, 1):
                admission = pairs["admit/release"][which]
                for label, tasks, places in (
                    ("admit/release", 1, 4),
                    ("admit/release, contended", 8, 4),
                ):
                    us = runner.run(cycles(admission, args.cycles, tasks, places))
                    best[label, which] = min(us, best.get((label, which), us))
                us = observations(pairs["histogram observe"][which], args.cycles)
                best["histogram observe", which] = min(
                    us, best.get(("histogram observe", which), us)
                )
    print(f"{loop_name}, {args.cycles:,} per round, best of {args.rounds}; old: {OLD[:10]}")
    print(f"{'':28}{'old us':>10}{'new us':>10}{'new/old':>10}")
    for label in ("admit/release", "admit/release, contended", "histogram observe"):
        old, new = best[label, 0], best[label, 1]
        print(f"{label:28}{old:10.2f}{new:10.2f}{new / old:10.2f}")


if __name__ == "__main__":
    main()
