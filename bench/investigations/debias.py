"""Position debiasing compared on the labelled sets: none, cyclic, PriDe and contextual
calibration, on the same held-out items.

    .venv/bin/python bench/investigations/debias.py [--seed 0] [--test-share 0.3]
        [--prior-sample 0.2]

Starts llama-server and the proxy and reads every choice and noul item of
tests/data/*.jsonl (score levels are ordered and never debiased) three times
through ``POST /v1/systemone``: plain, ``x_debias: cyclic`` and ``x_debias:
contextual``. The items are split as ``python -m semif_tools calibrate`` splits them
(same seed and test share); PriDe's position prior is estimated from the cyclic
reads of the calibrate command's sample of the items outside the test split and
divided out of the plain reads. Every figure is of the test split, on the probabilities as read
(no calibration map): the share of answers choosing each position, accuracy and
ECE with 95% bootstrap intervals, and the upstream reads per question the proxy
reported (``x_reads``). Results also go to bench/out/debias.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: the shared helpers

from _machine import command_line, describe  # noqa: E402
from _servers import ROOT, llama_server, proxy  # noqa: E402

from proxy.calibration.transform import top_index  # noqa: E402
from semif_tools.calibrate.cli import apply_priors, estimate_priors, prior_sample  # noqa: E402
from semif_tools.calibrate.dataset import load_items  # noqa: E402
from semif_tools.calibrate.fit import THRESHOLD_SHARE, Labelled, assign_roles  # noqa: E402
from semif_tools.calibrate.read import read_answers  # noqa: E402
from semif_tools.calibrate.scores import accuracy, expected_calibration_error  # noqa: E402
from semif_tools.calibrate.stats import bootstrap_interval  # noqa: E402

__all__ = ["WAYS", "main"]

OUT = ROOT / "bench" / "out"
WAYS = ("none", "cyclic", "pride", "contextual")
_POSITIONS = "ABCD"


def _ci(metric, rows: list[Labelled]) -> str:
    probs, golds = [list(r.probabilities) for r in rows], [r.gold for r in rows]
    ci = bootstrap_interval(
        lambda pick: metric([probs[i] for i in pick], [golds[i] for i in pick]), len(rows)
    )
    return f"{ci.value:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def _shares(rows: list[Labelled], width: int) -> list[str]:
    picks = [top_index(r.probabilities) for r in rows]
    return [f"{sum(p == i for p in picks) / len(picks):.0%}" for i in range(width)]


def table(
    answers: dict[str, list[Labelled]],
    reads: dict[str, float],
    is_test: list[bool],
    kinds: list[str],
) -> list[str]:
    """One row per question type and way: n, position shares, accuracy, ECE, reads."""
    lines = [
        "| type | way | n | " + " | ".join(_POSITIONS) + " | accuracy | ECE | reads per question |",
        "|" + "---|" * (6 + len(_POSITIONS)),
    ]
    for kind in ("choice", "noul"):
        idx = [i for i, (k, t) in enumerate(zip(kinds, is_test)) if k == kind and t]
        if not idx:
            continue
        width = max(len(answers["none"][i].probabilities) for i in idx)
        gold = [answers["none"][i] for i in idx]
        golds = [f"{sum(r.gold == j for r in gold) / len(gold):.0%}" for j in range(width)]
        lines.append(
            f"| {kind} | gold answers | {len(idx)} | "
            + " | ".join(golds + [""] * (len(_POSITIONS) - width))
            + " | | | |"
        )
        for way in WAYS:
            rows = [answers[way][i] for i in idx]
            shares = _shares(rows, width) + [""] * (len(_POSITIONS) - width)
            lines.append(
                f"| {kind} | {way} | {len(rows)} | "
                + " | ".join(shares)
                + f" | {_ci(accuracy, rows)} | {_ci(expected_calibration_error, rows)}"
                f" | {reads[f'{kind}/{way}']:.2f} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--prior-sample", type=float, default=0.2)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests in flight (default 1: reads alone are bit-repeatable)",
    )
    args = parser.parse_args()
    machine = describe()
    items = [
        i
        for i in load_items(sorted((ROOT / "tests" / "data").glob("*.jsonl")))
        if i.kind != "score"
    ]
    kinds = [i.kind for i in items]
    roles = assign_roles(
        [Labelled(i.kind, (0.5, 0.5), i.gold) for i in items],
        args.test_share,
        THRESHOLD_SHARE,
        args.seed,
    )
    is_test = [r == "test" for r in roles]
    sample = prior_sample(items, is_test, args.prior_sample, args.seed)
    with llama_server() as llama_url, proxy(llama_url) as proxy_url:
        read = {
            way: read_answers(
                items,
                proxy_url,
                debias=None if way == "none" else way,
                concurrency=args.concurrency,
            )
            for way in ("none", "cyclic", "contextual")
        }
    priors = estimate_priors([read["cyclic"][i] for i in sample])
    answers = {way: [r.labelled for r in got] for way, got in read.items()}
    # as served: divided by the prior of the type and option count, else read cyclically
    answers["pride"] = [
        cyclic if len(r.probabilities) not in priors.get(r.kind, {}) else r
        for r, cyclic in zip(apply_priors(answers["none"], priors), answers["cyclic"])
    ]
    # a noul answer carries P(true) only (P(false) is 1 - P(true) here, rounded): compare that
    same = sum(
        (r.rotations[0] if r.kind == "choice" else r.rotations[0][:1])
        == (p.probabilities if r.kind == "choice" else p.probabilities[:1])
        for r, p in zip(read["cyclic"], read["none"])
        if r.rotations
    )
    reads: dict[str, float] = {}
    for kind in ("choice", "noul"):
        idx = [i for i, (k, t) in enumerate(zip(kinds, is_test)) if k == kind and t]
        for way in ("none", "cyclic", "contextual"):
            reads[f"{kind}/{way}"] = sum(read[way][i].reads or 0 for i in idx) / max(1, len(idx))
        reads[f"{kind}/pride"] = sum(
            (
                read["none"]
                if len(read["none"][i].probabilities) in priors.get(kind, {})
                else read["cyclic"]
            )[i].reads
            or 0
            for i in idx
        ) / max(1, len(idx))
    sample_reads = sum(read["cyclic"][i].reads or 0 for i in sample)
    lines = table(answers, reads, is_test, kinds)
    print(
        f"{len(items)} choice and noul items of tests/data, {sum(is_test)} in the test split "
        f"(seed {args.seed}, share {args.test_share}); PriDe prior from the cyclic reads of "
        f"{len(sample)} items outside it ({sample_reads} reads, once): "
        + "; ".join(
            f"{k}/{n}: " + ", ".join(f"{w:.3f}" for w in p)
            for k, by_n in priors.items()
            for n, p in by_n.items()
        )
    )
    print(f"cyclic shift 0 equals the plain read in {same} of {len(items)} items")
    print("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "debias.json"
    path.write_bytes(
        orjson.dumps(
            {
                "machine": machine,
                "command": command_line(),
                "table": lines,
                "priors": {k: {str(n): p for n, p in v.items()} for k, v in priors.items()},
                "sample": len(sample),
                "sample_reads": sample_reads,
                "shift0_equals_plain": same,
                "items": len(items),
                "test": sum(is_test),
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
