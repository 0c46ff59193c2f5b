"""``python -m semif_tools calibrate DATA.jsonl --profile NAME``: read, fit, write profile and
report.

Three steps, each its own function so tests can run them apart:
``read_answers`` (read.py, HTTP), ``fit_profile`` (profile_fit.py, pure),
``report.write_report`` (files). Rerank data (``query``, ``documents``, ``relevant``) takes
``rerank_main`` instead (rerank_fit.py).

``--records R --outcomes O`` fits on answers already recorded instead of reading them
(from_records.py); ``--write-outcomes`` writes the labelled set as outcomes of the decisions
the proxy recorded while reading it, so that both fits can be compared.

``--debias`` fits on debiased reads and compares them with plain ones: ``cyclic``
and ``contextual`` read every item that way; ``pride`` reads a sample of the
items not held out for testing cyclically (``--prior-sample``), estimates the
position prior from it per question type and option count, and divides it out
of the plain reads; items whose option count got no prior are read cyclically,
as the proxy serves them (decision/debias.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from proxy.calibration.profile import (
    DEFAULT_DIR,
    KindCalibration,
    Profile,
    Threshold,
    profile_path,
    save,
)
from proxy.decision.debias import divided, position_prior
from proxy.decision.prompt import PROMPT_FORMAT_VERSION

from ..outcomes import write_outcomes
from ..progress import Bar
from .dataset import DataError, Item, data_sha256, load_items
from .fit import MIN_AUTOMATED, TEST_SHARE, THRESHOLD_SHARE, Labelled, assign_roles
from .from_records import records_main
from .profile_fit import Priors, check_settings, fit_profile, parse_methods, summarise
from .read import AnswerError, Reading, read_answers, read_rerank_scores, served_model
from .rerank_fit import fit_rerank, is_rerank, load_rerank_items
from .stats import DEFAULT_LEVEL

__all__ = [
    "PRIOR_SAMPLE",
    "MIN_PRIOR_SAMPLE",
    "build_parser",
    "read_scheme_of",
    "prompt_format_of",
    "prior_sample",
    "estimate_priors",
    "apply_priors",
    "main",
    "rerank_main",
]

PRIOR_SAMPLE = 0.2  # share of the fit split's choice and noul items read cyclically for PriDe
MIN_PRIOR_SAMPLE = 10  # ... but at least this many per question type and option count


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semif_tools calibrate",
        description="Fit a calibration profile on labelled System One requests read through a "
        "running proxy (or on decision records and their outcomes: --records, --outcomes), "
        "and write the profile and a report whose figures come from a held-out test split "
        "that no choice saw.",
    )
    p.add_argument(
        "data",
        nargs="*",
        type=Path,
        help="JSONL files: one System One request with "
        'one question and a top-level "gold" per line (or --records and --outcomes)',
    )
    p.add_argument(
        "--records",
        nargs="+",
        type=Path,
        default=None,
        help="fit from decision records instead of reading DATA again (from_records.py): "
        "files, or folders read recursively in date order (aws s3 sync's copy of a dated "
        "prefix; s3:// URIs are not read)",
    )
    p.add_argument(
        "--outcomes",
        nargs="+",
        type=Path,
        default=None,
        help="with --records: outcomes in Model Monitor's ground-truth JSON lines (CSV or "
        "JSON encoding), keyed by decision id or the capture's inferenceId or eventId; files "
        "or folders as --records; their order is the labelled set's",
    )
    p.add_argument(
        "--write-outcomes",
        type=Path,
        default=None,
        help="with DATA: write each item's gold answer as an outcome (CSV encoding, as AWS "
        "documents ground truth) of the decision the proxy recorded for its plain read "
        "(x_decision_id), in DATA's order, to fit the same profile later with --records",
    )
    p.add_argument(
        "--group-by",
        action="store_true",
        help="with --records: records that differ in model, build, prompt format, layout, "
        "read scheme or debiasing are fitted apart, one profile NAME.1, NAME.2, ... per "
        "group (largest first) instead of refused",
    )
    p.add_argument("--profile", required=True, help="profile name ([A-Za-z0-9_.-]+)")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the running proxy")
    p.add_argument("--api-key", default=None, help="bearer key for the proxy")
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.95,
        help="accuracy the automated answers must reach (default 0.95)",
    )
    p.add_argument(
        "--level",
        type=float,
        default=DEFAULT_LEVEL,
        help="confidence level of the threshold's Clopper-Pearson bound and of the "
        f"reported intervals (default {DEFAULT_LEVEL})",
    )
    p.add_argument(
        "--min-automated",
        type=int,
        default=MIN_AUTOMATED,
        help=f"fewest held-out answers a threshold must be backed by (default {MIN_AUTOMATED})",
    )
    p.add_argument(
        "--test-share",
        type=float,
        default=TEST_SHARE,
        help=f"share of the items held out for the report (default {TEST_SHARE})",
    )
    p.add_argument(
        "--threshold-share",
        type=float,
        default=THRESHOLD_SHARE,
        help="share of the other items held out from the maps to test thresholds on "
        f"(default {THRESHOLD_SHARE})",
    )
    p.add_argument(
        "--label-mass-floor",
        type=float,
        default=None,
        help="route answers whose labels got less probability than this to review "
        "(default: fitted on the fit split)",
    )
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the folds")
    p.add_argument(
        "--debias",
        choices=["cyclic", "pride", "contextual"],
        default=None,
        help="fit on debiased reads and compare them with plain ones",
    )
    p.add_argument(
        "--prior-sample",
        type=float,
        default=PRIOR_SAMPLE,
        help="pride: share of the fit split read cyclically to estimate the position "
        f"prior (default {PRIOR_SAMPLE}, at least {MIN_PRIOR_SAMPLE} per type "
        "and option count)",
    )
    p.add_argument(
        "--methods",
        default="temperature,platt,isotonic",
        help="comma-separated methods to try (default temperature,platt,isotonic)",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"where the profile and report go (default {DEFAULT_DIR})",
    )
    p.add_argument("--limit", type=int, default=None, help="use only the first N items")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    p.add_argument(
        "--k",
        type=int,
        default=3,
        help="rerank data: the cut-off of the reported NDCG@k (default 3)",
    )
    return p


def read_scheme_of(readings: Sequence[Reading]) -> str:
    """The read scheme the proxy reported ("" when it did not, or when it changed
    during the run: then the profile records none and is never warned about)."""
    schemes = {r.read_scheme for r in readings if r.read_scheme}
    return schemes.pop() if len(schemes) == 1 else ""


def prompt_format_of(readings: Sequence[Reading]) -> str:
    """The prompt format version the proxy reported; all answers must agree."""
    versions = {r.prompt_format_version for r in readings if r.prompt_format_version}
    if len(versions) > 1:
        raise AnswerError(f"the proxy answered in several prompt formats: {sorted(versions)}")
    return versions.pop() if versions else PROMPT_FORMAT_VERSION


def prior_sample(
    items: Sequence[Item], is_test: Sequence[bool], share: float = PRIOR_SAMPLE, seed: int = 0
) -> list[int]:
    """Indices of the choice and noul items outside the test split to read cyclically:
    within each (question type, option count), a seeded draw of max(MIN_PRIOR_SAMPLE,
    share x size) (all of them when fewer). No labels are needed."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, item in enumerate(items):
        if not is_test[i] and item.kind != "score":
            groups.setdefault((item.kind, len(item.names)), []).append(i)
    rng = random.Random(seed)
    picked: list[int] = []
    for key in sorted(groups):
        members = groups[key]
        take = min(len(members), max(MIN_PRIOR_SAMPLE, round(share * len(members))))
        picked += sorted(rng.sample(members, take))
    return sorted(picked)


def estimate_priors(readings: Sequence[Reading]) -> Priors:
    """The PriDe prior per question type and option count, from cyclic readings."""
    by_group: dict[tuple[str, int], list[tuple[tuple[float, ...], ...]]] = {}
    for r in readings:
        if r.rotations and len(r.rotations) == len(r.probabilities):  # every shift read
            by_group.setdefault((r.kind, len(r.probabilities)), []).append(r.rotations)
    priors: Priors = {}
    for (kind, n), questions in sorted(by_group.items()):
        priors.setdefault(kind, {})[n] = tuple(position_prior(questions))
    return priors


def apply_priors(readings: Sequence[Labelled], priors: Priors) -> list[Labelled]:
    """Plain readings with the prior of their type and option count divided out (as the
    proxy does for a PriDe profile; counts without a prior are left as read)."""
    out = []
    for r in readings:
        prior = priors.get(r.kind, {}).get(len(r.probabilities))
        out.append(
            r if prior is None else replace(r, probabilities=tuple(divided(r.probabilities, prior)))
        )
    return out


def _read(items, args, debias: str | None) -> list[Reading]:
    label = f"reading ({debias})" if debias else "reading"
    with Bar(len(items), label, unit="item") as bar:
        return read_answers(
            items,
            args.url,
            api_key=args.api_key,
            debias=debias,
            concurrency=args.concurrency,
            progress=bar.update,
        )


def _debiased(
    items: Sequence[Item], plain: Sequence[Reading], args: argparse.Namespace
) -> tuple[list[Labelled] | None, Priors | None, list[Reading]]:
    """The readings to fit on when debiasing, the PriDe priors, and every extra reading."""
    if args.debias in ("cyclic", "contextual"):
        extra = _read(items, args, args.debias)
        return [r.labelled for r in extra], None, extra
    if args.debias == "pride":
        roles = assign_roles(
            [r.labelled for r in plain], args.test_share, args.threshold_share, args.seed
        )
        sample = prior_sample(items, [r == "test" for r in roles], args.prior_sample, args.seed)
        extra = _read([items[i] for i in sample], args, "cyclic")
        priors = estimate_priors(extra)
        # what the proxy serves for an option count without a prior: a cyclic read
        unpriored = [
            i
            for i, item in enumerate(items)
            if item.kind != "score" and len(item.names) not in priors.get(item.kind, {})
        ]
        cyclic = dict(zip(unpriored, _read([items[i] for i in unpriored], args, "cyclic")))
        readings = apply_priors([r.labelled for r in plain], priors)
        for i, reading in cyclic.items():
            readings[i] = reading.labelled
        return readings, priors, [*extra, *cyclic.values()]
    return None, None, []


def _write_outcomes(path: Path, items: Sequence[Item], plain: Sequence[Reading]) -> None:
    """--write-outcomes: the labelled set as outcomes of the plain reads' decisions."""
    missing = [item.source for item, r in zip(items, plain) if not r.decision_id]
    if missing:
        raise AnswerError(
            f"{missing[0]}: the proxy's answer carries no x_decision_id (--write-outcomes "
            "needs a proxy that numbers its decisions)"
        )
    n = write_outcomes(
        path, ((r.decision_id or "", item.names[item.gold]) for item, r in zip(items, plain))
    )
    print(f"wrote {n} outcomes to {path}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.data) == bool(args.records):
        parser.error("give either DATA files or --records (with --outcomes)")
    if args.records:
        return records_main(args)
    if _rerank_data(args.data):
        return rerank_main(args)
    from .report import write_report  # matplotlib only when a report is written

    try:
        profile_path(args.profile, args.out_dir)
        methods = parse_methods(args.methods)
        check_settings(args)
        items = load_items(args.data, args.limit)
        model, build = served_model(args.url, args.api_key)
        plain = _read(items, args, None)
        if args.write_outcomes is not None:
            _write_outcomes(args.write_outcomes, items, plain)
        debiased, priors, extra = _debiased(items, plain, args)
        fitted = fit_profile(
            debiased or [r.labelled for r in plain],
            name=args.profile,
            model=model,
            prompt_format_version=prompt_format_of([*plain, *extra]),
            data_sha256=data_sha256(args.data),
            target_accuracy=args.target_accuracy,
            min_automated=args.min_automated,
            level=args.level,
            test_share=args.test_share,
            threshold_share=args.threshold_share,
            label_mass_floor=args.label_mass_floor,
            folds=args.folds,
            seed=args.seed,
            methods=methods,
            debias=args.debias,
            plain=[r.labelled for r in plain] if debiased else None,
            llama_build=build,
            position_prior=priors,
            read_scheme=read_scheme_of([*plain, *extra]),
        )
    except (ValueError, AnswerError, OSError) as exc:  # DataError and ProfileError are ValueErrors
        kind = "data" if isinstance(exc, DataError) else "error"
        print(f"calibrate: {kind}: {exc}", file=sys.stderr)
        return 2
    path = save(fitted.profile, args.out_dir)
    paths = write_report(args.out_dir, fitted.profile, fitted.fit, fitted.plain)
    summarise(fitted, path, paths)
    return 0


def _rerank_data(paths: Sequence[Path]) -> bool:
    """Whether the data is rerank data (query, documents, relevant): its first line says."""
    try:
        for line in paths[0].read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                return is_rerank(json.loads(line))
    except (OSError, ValueError):
        return False  # the System One path reports the problem with its line number
    return False


def rerank_main(args: argparse.Namespace) -> int:
    """Rerank data: the pointwise scores' map, judged on held-out queries (rerank_fit.py)."""
    try:
        profile_path(args.profile, args.out_dir)
        items = load_rerank_items(args.data, args.limit)
        model, build = served_model(args.url, args.api_key)
        if args.k < 1:
            raise ValueError("--k must be at least 1")
        with Bar(len(items), "reading", unit="query") as bar:
            scores, version = read_rerank_scores(
                items, args.url, api_key=args.api_key, progress=bar.update
            )
        fit = fit_rerank(items, scores, test_share=args.test_share, seed=args.seed, k=args.k)
    except (ValueError, AnswerError, OSError) as exc:
        kind = "data" if isinstance(exc, DataError) else "error"
        print(f"calibrate: {kind}: {exc}", file=sys.stderr)
        return 2
    figures = {
        f: getattr(fit, f)
        for f in (
            "method",
            "a",
            "b",
            "n_fit_queries",
            "n_fit_pairs",
            "n_test_queries",
            "n_test_pairs",
            "k",
            "ndcg",
            "mrr",
            "ndcg_chance",
            "mrr_chance",
            "ece_before",
            "ece_after",
            "note",
        )
    }
    profile = Profile(
        name=args.profile,
        model=model,
        prompt_format_version=version,
        created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        data_sha256=data_sha256(args.data),
        calibration={"noul": KindCalibration(fit.method, fit.params(), fit.n_fit_pairs)},
        threshold=Threshold(
            args.target_accuracy,
            None,
            0.0,
            source=(
                "rerank: the scores are calibrated probabilities of relevance; no route threshold "
                "is fitted, choose the cut your use needs"
            ),
        ),
        n_items=sum(len(i.documents) for i in items),
        seed=args.seed,
        metrics={"rerank": figures},
        llama_build=build,
    )
    path = save(profile, args.out_dir)
    fitted = (
        f"Platt a={fit.a:.4f} b={fit.b:.4f}"
        if fit.method == "platt"
        else f"no map kept: {fit.note}"
    )
    print(
        f"rerank: {len(items)} queries; fitted on {fit.n_fit_pairs} pairs of "
        f"{fit.n_fit_queries} queries: {fitted}"
    )
    print(
        f"held-out {fit.n_test_queries} queries ({fit.n_test_pairs} pairs): NDCG@{fit.k} "
        f"{fit.ndcg:.4f} (a random order: {fit.ndcg_chance:.4f}), MRR {fit.mrr:.4f} "
        f"({fit.mrr_chance:.4f}); the same before and after, the map being increasing; "
        f"ECE {fit.ece_before:.4f} -> {fit.ece_after:.4f}"
    )
    print(f"wrote {path}")
    return 0
