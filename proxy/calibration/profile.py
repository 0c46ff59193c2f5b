"""Calibration profiles: the file format, and applying one to an answer.

A profile is ``config/calibration/NAME.json`` (any directory may be passed):

    {"profile_format": 1, "name": "tickets", "created": "2026-11-30T12:00:00Z",
     "model": "<GET /v1/models data[0].id>", "prompt_format_version": "semif-1",
     "data_sha256": "<hex>", "n_items": 340, "folds": 5, "seed": 0, "debias": null | "cyclic",
     "calibration": {"choice": {"method": "temperature", "params": {"temperature": 2.1},
                                "n_items": 180},
                     "noul": {"method": "platt", "params": {"a": 0.4, "b": -0.2}, ...},
                     "score": {"method": "isotonic", "params": {"x": [...], "y": [...]}, ...}},
     "threshold": {"target_accuracy": 0.95, "threshold": 0.91 | null, "coverage": 0.4,
                   "accuracy": 0.96 | null, "count": 150, "min_count": 10, "level": 0.95,
                   "lower_bound": 0.951 | null, "source": "<which answers it was tested on>",
                   "test": {<the threshold applied to the held-out test split>}},
     "label_mass_floor": 0.31,
     "position_prior": {"choice": {"4": [0.4, 0.3, 0.2, 0.1]}, "noul": {"2": [0.6, 0.4]}},
     "metrics": {"evaluation": "...", "before": {"all": {...}, "choice": {...}}, "after": {...}}}

``threshold: null`` means no threshold passed the fixed-sequence test
(``stats.py``): ``route`` then sends every answer to review. An answer whose
label mass is below ``label_mass_floor`` goes to review whatever its
probability: the model was not answering with a label. ``position_prior`` (PriDe,
``debias: "pride"``) is the model's preference for each position, per question
type and option count, divided out of every later answer. A question type missing
from ``calibration`` (or with method ``"none"``) is left as it is. The maps
themselves are described in ``transform.py``.

Errors (all ``ValueError``s, so a route can answer 400):

    ProfileError
    ├── InvalidProfileName   the name is not [A-Za-z0-9_.-]+, starts with a dot, or is "none"
    ├── ProfileNotFound      no such file
    ├── ProfileInvalid       the file is not a valid profile
    └── ProfileMismatch      fitted for another model or prompt format version

Longer than 400 lines on purpose: the file format is read, validated and written here
only, so that the fitting tools and the server can never disagree on what a profile is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from .transform import METHODS, apply_method

__all__ = [
    "PROFILE_FORMAT",
    "DEFAULT_DIR",
    "NAME_PATTERN",
    "RESERVED_NAMES",
    "DEBIAS_MODES",
    "ROUTE_REASONS",
    "ProfileError",
    "InvalidProfileName",
    "ProfileNotFound",
    "ProfileInvalid",
    "ProfileMismatch",
    "KindCalibration",
    "Threshold",
    "Profile",
    "profile_path",
    "load",
    "save",
    "apply",
    "route",
    "check_compatible",
    "same_model",
    "other_build",
]

PROFILE_FORMAT = 1
DEFAULT_DIR = Path("config/calibration")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
RESERVED_NAMES = frozenset({"none"})  # a request's "calibration": "none" means no profile
DEBIAS_MODES = (None, "cyclic", "pride", "contextual")
ROUTE_REASONS = ("label_mass", "no_threshold", "below_threshold", "above_threshold")
_KINDS = ("choice", "score", "noul")


class ProfileError(ValueError):
    pass


class InvalidProfileName(ProfileError):
    pass


class ProfileNotFound(ProfileError):
    pass


class ProfileInvalid(ProfileError):
    pass


class ProfileMismatch(ProfileError):
    def __init__(self, message: str, *, field: str, profile_value: str, server_value: str):
        super().__init__(message)
        self.field = field
        self.profile_value = profile_value
        self.server_value = server_value


@dataclass(frozen=True)
class KindCalibration:
    method: str  # one of transform.METHODS
    params: Mapping[str, Any] = field(default_factory=dict)
    n_items: int = 0


@dataclass(frozen=True)
class Threshold:
    target_accuracy: float
    threshold: float | None  # None: the target was not reached; everything goes to review
    coverage: float
    accuracy: float | None = None
    count: int = 0  # held-out answers at or above the threshold
    min_count: int = 0  # the fewest held-out answers a threshold had to be backed by
    level: float | None = None  # of the Clopper-Pearson bound (None in older profiles)
    lower_bound: float | None = None  # on the accuracy of the answers at or above it
    source: str = ""  # which answers it was tested on
    test: Mapping[str, Any] = field(default_factory=dict)  # applied to the test split


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    prompt_format_version: str
    created: str
    data_sha256: str
    calibration: Mapping[str, KindCalibration]
    threshold: Threshold
    debias: Literal["cyclic", "pride", "contextual"] | None = None
    n_items: int = 0
    folds: int = 0
    seed: int = 0
    metrics: Mapping[str, Any] = field(default_factory=dict)
    llama_build: str = ""  # llama-server's /props build_info when fitted ("" if not known)
    read_scheme: str = ""  # how the fitted answers were read ("prefix-63", "segment"; "": unknown)
    label_mass_floor: float = 0.0  # below it an answer goes to review
    # PriDe: kind -> option count -> the prior over positions (debias "pride")
    position_prior: Mapping[str, Mapping[int, tuple[float, ...]]] = field(default_factory=dict)

    def prior(self, kind: str, n_options: int) -> tuple[float, ...] | None:
        """The position prior for this question type and option count, if estimated."""
        return self.position_prior.get(kind, {}).get(n_options)

    def method(self, kind: str) -> str:
        """The method applied to answers of this question type ("none" when not fitted)."""
        entry = self.calibration.get(kind)
        return entry.method if entry is not None else "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "profile_format": PROFILE_FORMAT,
            "name": self.name,
            "created": self.created,
            "model": self.model,
            "prompt_format_version": self.prompt_format_version,
            "llama_build": self.llama_build,
            "read_scheme": self.read_scheme,
            "data_sha256": self.data_sha256,
            "n_items": self.n_items,
            "folds": self.folds,
            "seed": self.seed,
            "debias": self.debias,
            "calibration": {
                kind: {"method": c.method, "params": dict(c.params), "n_items": c.n_items}
                for kind, c in self.calibration.items()
            },
            "threshold": {
                "target_accuracy": self.threshold.target_accuracy,
                "threshold": self.threshold.threshold,
                "coverage": self.threshold.coverage,
                "accuracy": self.threshold.accuracy,
                "count": self.threshold.count,
                "min_count": self.threshold.min_count,
                "level": self.threshold.level,
                "lower_bound": self.threshold.lower_bound,
                "source": self.threshold.source,
                "test": dict(self.threshold.test),
            },
            "label_mass_floor": self.label_mass_floor,
            "position_prior": {
                kind: {str(n): list(p) for n, p in sorted(priors.items())}
                for kind, priors in self.position_prior.items()
            },
            "metrics": dict(self.metrics),
        }

    @classmethod
    def from_json(cls, data: object) -> Profile:
        """Validate and build; any problem is a ``ProfileInvalid`` saying what is wrong."""
        try:
            return _from_json(data)
        except ProfileInvalid:
            raise
        except KeyError as exc:
            raise ProfileInvalid(f"not a calibration profile: missing field {exc}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise ProfileInvalid(f"not a calibration profile: {exc!r}") from exc


def _number(value: object, what: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileInvalid(f"{what} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ProfileInvalid(f"{what} must be within [{lo}, {hi}], got {value!r}")
    return float(value)


def _kind_calibration(kind: str, raw: Mapping[str, Any]) -> KindCalibration:
    method, params = raw["method"], dict(raw.get("params") or {})
    where = f"calibration.{kind}"
    if method not in METHODS:
        raise ProfileInvalid(f"{where}.method must be one of {list(METHODS)}, got {method!r}")
    if method == "temperature":
        _number(params["temperature"], f"{where}.params.temperature", lo=1e-300)
    elif method == "platt":
        if kind != "noul":
            raise ProfileInvalid(f"{where}: Platt scaling is for noul questions only")
        _number(params["a"], f"{where}.params.a")
        _number(params["b"], f"{where}.params.b")
    elif method == "isotonic":
        xs = [_number(x, f"{where}.params.x", lo=0, hi=1) for x in params["x"]]
        ys = [_number(y, f"{where}.params.y", lo=0, hi=1) for y in params["y"]]
        if not xs or len(xs) != len(ys):
            raise ProfileInvalid(f"{where}.params: x and y must be non-empty and of equal length")
        if any(a >= b for a, b in zip(xs, xs[1:])) or any(a > b for a, b in zip(ys, ys[1:])):
            raise ProfileInvalid(f"{where}.params: x must increase and y must not decrease")
        params = {"x": xs, "y": ys}
    return KindCalibration(method, params, int(raw.get("n_items", 0)))


def _from_json(data: Any) -> Profile:
    if not isinstance(data, Mapping) or data.get("profile_format") != PROFILE_FORMAT:
        raise ProfileInvalid(f"not a calibration profile of format {PROFILE_FORMAT}")
    calibration = {}
    for kind, raw in data["calibration"].items():
        if kind not in _KINDS:
            raise ProfileInvalid(f"calibration: unknown question type {kind!r}")
        calibration[kind] = _kind_calibration(kind, raw)
    t = data["threshold"]
    if "threshold" not in t:
        raise ProfileInvalid("threshold.threshold is missing (null if the target was not reached)")

    def share(key: str) -> float | None:
        return None if t.get(key) is None else _number(t[key], f"threshold.{key}", lo=0, hi=1)

    threshold = Threshold(
        _number(t["target_accuracy"], "threshold.target_accuracy", lo=0, hi=1),
        share("threshold"),
        _number(t["coverage"], "threshold.coverage", lo=0, hi=1),
        share("accuracy"),
        int(_number(t.get("count", 0), "threshold.count", lo=0)),
        int(_number(t.get("min_count", 0), "threshold.min_count", lo=0)),
        None if t.get("level") is None else _number(t["level"], "threshold.level", lo=0, hi=1),
        share("lower_bound"),
        str(t.get("source", "")),
        dict(t.get("test") or {}),
    )
    if data.get("debias") not in DEBIAS_MODES:
        raise ProfileInvalid(
            f"debias must be one of {list(DEBIAS_MODES)}, got {data.get('debias')!r}"
        )
    priors = _priors(data.get("position_prior") or {})
    if data.get("debias") == "pride" and not priors:
        raise ProfileInvalid('debias "pride" needs a position_prior')
    for key in ("name", "model", "prompt_format_version", "created", "data_sha256"):
        if not isinstance(data[key], str):
            raise ProfileInvalid(f"{key} must be a string")
    for key in ("llama_build", "read_scheme"):
        if not isinstance(data.get(key, ""), str):
            raise ProfileInvalid(f"{key} must be a string")
    return Profile(
        name=data["name"],
        model=data["model"],
        prompt_format_version=data["prompt_format_version"],
        created=data["created"],
        data_sha256=data["data_sha256"],
        calibration=calibration,
        threshold=threshold,
        debias=data.get("debias"),
        n_items=int(data.get("n_items", 0)),
        folds=int(data.get("folds", 0)),
        seed=int(data.get("seed", 0)),
        metrics=dict(data.get("metrics") or {}),
        llama_build=data.get("llama_build", ""),
        read_scheme=data.get("read_scheme", ""),
        label_mass_floor=_number(data.get("label_mass_floor", 0.0), "label_mass_floor", lo=0, hi=1),
        position_prior=priors,
    )


def _priors(raw: Mapping[str, Any]) -> dict[str, dict[int, tuple[float, ...]]]:
    out: dict[str, dict[int, tuple[float, ...]]] = {}
    for kind, by_count in raw.items():
        if kind not in ("choice", "noul"):
            raise ProfileInvalid(f"position_prior: no positions to debias for {kind!r}")
        out[kind] = {}
        for count, prior in by_count.items():
            if not str(count).isdigit() or len(prior) != int(count) or int(count) < 2:
                raise ProfileInvalid(f"position_prior.{kind}.{count}: one weight per position")
            weights = tuple(_number(w, f"position_prior.{kind}.{count}", lo=0, hi=1) for w in prior)
            if not all(w > 0 for w in weights) or abs(math.fsum(weights) - 1) > 1e-6:
                raise ProfileInvalid(
                    f"position_prior.{kind}.{count}: positive weights that sum to 1"
                )
            out[kind][int(count)] = weights
    return out


def profile_path(name: str, directory: Path | str = DEFAULT_DIR) -> Path:
    """``directory/NAME.json``; a name that is not [A-Za-z0-9_.-]+, that starts with a dot or
    that is reserved ("none") is refused, so no name reaches outside the directory."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name.startswith("."):
        raise InvalidProfileName(
            f"invalid calibration profile name {name!r}: use letters, digits, '_', '.', '-' "
            "(not starting with '.')"
        )
    if name.lower() in RESERVED_NAMES:
        raise InvalidProfileName(f"{name!r} is reserved (it asks for no calibration)")
    return Path(directory) / f"{name}.json"


def load(name: str, directory: Path | str = DEFAULT_DIR) -> Profile:
    path = profile_path(name, directory)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ProfileNotFound(f"no calibration profile {name!r} in {directory}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileInvalid(f"calibration profile {name!r} is not valid JSON: {exc}") from exc
    profile = Profile.from_json(data)
    if profile.name != name:
        raise ProfileInvalid(f"file {path.name} holds profile {profile.name!r}, not {name!r}")
    return profile


def save(profile: Profile, directory: Path | str = DEFAULT_DIR) -> Path:
    path = profile_path(profile.name, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps(profile.to_json(), indent=2, allow_nan=False) + "\n"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def apply(profile: Profile, kind: str, probabilities: Sequence[float]) -> list[float]:
    """Calibrated probabilities (option order; noul ``[P(true), P(false)]``) for a question of
    this type. Temperature scaling never changes the choice; see transform.py."""
    if kind not in _KINDS:
        raise ValueError(f"unknown question type {kind!r}")
    entry = profile.calibration.get(kind)
    if entry is None:
        return [float(p) for p in probabilities]
    return apply_method(entry.method, entry.params, kind, probabilities)


def route(
    profile: Profile, probabilities: Sequence[float], label_mass: float, floor: float | None = None
) -> tuple[Literal["auto", "review"], str]:
    """The route and why: "review" because the labels got less than ``floor`` (the request's
    override, else the profile's) of the model's probability ("label_mass"), because the
    profile has no threshold ("no_threshold") or because the (calibrated) top probability is
    below it ("below_threshold"); otherwise "auto" ("above_threshold")."""
    limit = profile.label_mass_floor if floor is None else floor
    if label_mass < limit:
        return "review", "label_mass"
    t = profile.threshold.threshold
    if t is None:
        return "review", "no_threshold"
    if max(probabilities) >= t:
        return "auto", "above_threshold"
    return "review", "below_threshold"


def same_model(fitted: str, served: str) -> bool:
    """Equal ids, or the same GGUF file: llama-server's id is the path it was given (which
    differs between a laptop and a container) or its ``--alias``, the file's stem."""
    if fitted == served:
        return True
    if not any(m.lower().endswith(".gguf") for m in (fitted, served)):
        return False
    stems = {_gguf_stem(m) for m in (fitted, served)}
    return len(stems) == 1


def _gguf_stem(model: str) -> str:
    name = PureWindowsPath(PurePosixPath(model).name).name
    return name[:-5] if name.lower().endswith(".gguf") else name


def other_build(profile: Profile, served_build: str) -> bool:
    """Whether the profile was fitted on another llama.cpp build than the one serving now
    (both known): its probabilities may differ slightly, so a route should warn."""
    return bool(profile.llama_build and served_build) and profile.llama_build != served_build


def check_compatible(profile: Profile, model: str, prompt_format_version: str) -> None:
    """Raise ``ProfileMismatch`` unless the profile was fitted for this model and prompt format."""
    if not same_model(profile.model, model):
        raise ProfileMismatch(
            f"calibration profile {profile.name!r} was fitted for model {profile.model!r}, "
            f"but this server runs {model!r}",
            field="model",
            profile_value=profile.model,
            server_value=model,
        )
    if profile.prompt_format_version != prompt_format_version:
        raise ProfileMismatch(
            f"calibration profile {profile.name!r} was fitted for prompt format "
            f"{profile.prompt_format_version!r}, but this server uses {prompt_format_version!r}",
            field="prompt_format_version",
            profile_value=profile.prompt_format_version,
            server_value=prompt_format_version,
        )
