"""Calibration profiles at serving time: pick, load, check, apply.

A request names a profile (``semif.calibration`` / ``x_calibration``), or
``"none"`` for none; otherwise the configured default applies. A profile
fitted for another model or prompt format version is refused (400), never
applied silently. Applying it is pure: new probabilities for the same
question, from which the answer (choice, confidence, ...) is rebuilt, plus
the route ("auto" above the profile's threshold and label-mass floor, "review"
otherwise) and its reason. A PriDe profile's position prior is divided out
first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .calibration import profile as fitted
from .decision.debias import divide_out, shifts
from .decision.outcome import Outcome
from .decision.prompt import PROMPT_FORMAT_VERSION
from .decision.question import Question
from .errors import InvalidRequest, ProfileRefused
from .upstream import ModelInfo

__all__ = [
    "ProfileStore",
    "DebiasPlan",
    "apply_profile",
    "debias_for",
    "NO_PROFILE",
]

NO_PROFILE = "none"
_log = logging.getLogger("proxy.profile_store")
_MAX_NAME = 128


class ProfileStore:
    """Profiles from one directory, re-read when their file changes."""

    def __init__(self, directory: str | Path, default: str | None = None):
        self._dir = Path(directory)
        self._default = default
        self._cache: dict[str, tuple[float, fitted.Profile]] = {}
        self._warned: set[tuple[str, str, str]] = set()

    def select(
        self, requested: str | None, *, param: str, info: ModelInfo | None = None
    ) -> fitted.Profile | None:
        """The profile a request asked for (or the default); ``None`` for none. The
        default applies only to the model it was fitted for (``info``): behind a
        llama-server router, requests for the other models get none."""
        name = requested if requested is not None else self._default
        if name is None or name == NO_PROFILE:
            return None
        found = self._load(name, param=param)
        if requested is None and info is not None and not fitted.same_model(found.model, info.id):
            return None
        return found

    def _load(self, name: str, *, param: str) -> fitted.Profile:
        if len(name) > _MAX_NAME:
            raise ProfileRefused(
                f"calibration profile names are at most {_MAX_NAME} characters", param=param
            )
        try:
            path = fitted.profile_path(name, self._dir)
            try:
                mtime = path.stat().st_mtime  # one stat per request: re-read when it changes
            except FileNotFoundError:
                mtime = -1.0  # load() below says which profile is missing
            cached = self._cache.get(name)
            if cached is None or cached[0] != mtime:
                self._cache[name] = (mtime, fitted.load(name, self._dir))
            return self._cache[name][1]
        except (fitted.ProfileError, OSError) as err:
            raise ProfileRefused(str(err), param=param) from err

    def check(
        self,
        profile: fitted.Profile,
        info: ModelInfo,
        *,
        param: str,
        version: str = PROMPT_FORMAT_VERSION,
        scheme: str = "",
    ) -> None:
        """Refuse a profile fitted for another model or prompt format (the request's
        layout); warn (once per profile and build, or read scheme) when it was fitted on
        another llama.cpp build or read scheme: the numbers can differ slightly."""
        try:
            fitted.check_compatible(profile, info.id, version)
        except fitted.ProfileMismatch as err:
            raise ProfileRefused(str(err), param=param) from err
        if (
            profile.read_scheme
            and scheme
            and profile.read_scheme != scheme
            and (seen := (profile.name, profile.read_scheme, scheme)) not in self._warned
        ):
            self._warned.add(seen)
            _log.warning(
                "calibration profile %r was fitted on reads of the %s scheme and is applied "
                "on %s: the numbers can differ slightly; refit it (docs/calibration.md)",
                profile.name,
                profile.read_scheme,
                scheme,
            )
        if fitted.other_build(profile, info.build) and (
            (seen := (profile.name, profile.llama_build, info.build)) not in self._warned
        ):
            self._warned.add(seen)
            _log.warning(
                "calibration profile %r was fitted on llama.cpp %s and is applied on %s: "
                "the builds' probabilities can differ slightly; refit it on this build",
                profile.name,
                profile.llama_build,
                info.build,
            )


@dataclass(frozen=True)
class DebiasPlan:
    """How a question is debiased: ``method`` None, "cyclic" (``shifts``), "pride"
    (``prior``) or "contextual"; ``note`` says why it differs from what was asked."""

    method: str | None = None
    shifts: tuple[int, ...] = ()
    prior: tuple[float, ...] | None = None
    note: str = ""


_NO_PLAN = DebiasPlan()


def debias_for(
    profile: fitted.Profile | None,
    question: Question,
    method: str | None,
    requested: Sequence[int],
    *,
    param: str,
) -> DebiasPlan:
    """The request's debiasing, else the profile's. PriDe needs the profile's prior for
    this question type and option count; without one the question is read cyclically
    (the profile's answers were debiased, so a plain read would not fit them) and the
    note says so. Score levels are ordered: never debiased."""
    if question.kind == "score":
        return DebiasPlan()
    wanted = method if method is not None else (profile.debias if profile else None)
    if wanted == "cyclic":
        return DebiasPlan("cyclic", tuple(requested) or tuple(shifts(len(question.names))))
    if wanted == "contextual":
        return DebiasPlan("contextual")
    if wanted == "pride":
        if profile is None or not profile.position_prior:
            raise InvalidRequest(
                'debias "pride" divides out a position prior estimated by '
                "`python -m semif_tools calibrate --debias pride`: name a profile "
                "fitted that way",
                param=param,
            )
        n = len(question.names)
        prior = profile.prior(question.kind, n)
        if prior is None:
            return DebiasPlan(
                "cyclic",
                tuple(shifts(n)),
                note=f"no position prior for {question.kind} questions with "
                f"{n} options in profile {profile.name!r}: read cyclically",
            )
        return DebiasPlan("pride", prior=prior)
    return DebiasPlan()


def apply_profile(
    profile: fitted.Profile | None, outcome: Outcome, plan: DebiasPlan, floor: float | None = None
) -> Outcome:
    """The outcome with the position prior divided out (PriDe), then calibrated
    probabilities, their argmax, the method and the route with its reason."""
    if profile is None and plan == _NO_PLAN:
        return outcome  # the common case: nothing to apply
    if plan.prior is not None:
        outcome = replace(outcome, decision=divide_out(outcome.decision, plan.prior))
    outcome = replace(outcome, debias=plan.method or outcome.debias, debias_note=plan.note)
    if profile is None:
        return outcome
    decision = outcome.decision
    kind = decision.question.kind
    probs = tuple(fitted.apply(profile, kind, decision.probabilities))
    method = profile.method(kind)
    # temperature scaling keeps the choice (taken from the log-probabilities, which
    # rounding cannot tie); the other maps may move it on purpose
    best = (
        decision.best
        if method in ("none", "temperature")
        else max(range(len(probs)), key=lambda i: probs[i])
    )
    route, reason = fitted.route(profile, probs, decision.label_mass, floor)
    return replace(
        outcome,
        decision=replace(decision, probabilities=probs, best=best),
        calibration={"profile": profile.name, "method": method},
        route=route,
        route_reason=reason,
    )
