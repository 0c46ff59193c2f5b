"""Typed keys for the objects the application shares with its handlers."""

from __future__ import annotations

from aiohttp import web

from .admission import Admission
from .config import Settings
from .facts import Facts
from .metrics import Metrics
from .profile_store import ProfileStore
from .recorder import Recorder
from .served import ServedModels
from .upstream import Upstream

__all__ = [
    "SETTINGS",
    "UPSTREAM",
    "MODELS",
    "METRICS",
    "PROFILES",
    "ADMISSION",
    "RECORDER",
    "KIND",
    "ARRIVED",
    "API",
    "FACT_SHEET",
]

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
MODELS = web.AppKey("models", ServedModels)
METRICS = web.AppKey("metrics", Metrics)
PROFILES = web.AppKey("profiles", ProfileStore)
ADMISSION = web.AppKey("admission", Admission)
RECORDER = web.AppKey("recorder", Recorder)

# What a request turned out to be ("decision" or "relay"), for the metrics.
KIND = web.RequestKey("kind", str)
# Which API's error shape the request is answered in ("openai" or "systemone").
API = web.RequestKey("api", str)
# When the request arrived (``time.perf_counter()``): a decision record's latency starts here.
ARRIVED = web.RequestKey("arrived", float)
# What the request learns as it is served (proxy/facts.py): made by the middleware, handed
# down to the decision service, read back for the metrics and the Server-Timing header.
FACT_SHEET = web.RequestKey("facts", Facts)
