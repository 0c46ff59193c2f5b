"""Typed keys for the objects the application shares with its handlers."""

from __future__ import annotations

from aiohttp import web

from .config import Settings
from .service import DecisionService
from .upstream import Upstream

__all__ = ["SETTINGS", "UPSTREAM", "SERVICE"]

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
SERVICE = web.AppKey("service", DecisionService)
