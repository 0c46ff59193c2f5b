"""GET /playground: a page to try decisions by hand; /playground/report: the newest
calibration report with its two figures. No build step, no external assets.

The page is static (it holds no data and asks ``/v1/systemone`` itself, with the key
typed into it), so it is open like ``/health``; the report and its figures follow the
API key like every other route.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from aiohttp import web

from ..app_keys import SETTINGS
from ..calibration.profile import NAME_PATTERN
from ..errors import NotFound

__all__ = ["PAGE", "playground", "report_page", "report_figure"]

PAGE = Path(__file__).resolve().parent.parent / "static" / "playground.html"
_FIGURE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)\.(?:reliability|coverage)\.png$")
_CSS = (
    "body{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
    "img{max-width:100%;border:1px solid #ddd;margin:.5rem 0}pre{white-space:pre-wrap;"
    "background:#f6f6f6;padding:1rem;font-size:13px}"
)


async def playground(request: web.Request) -> web.Response:
    return web.Response(body=PAGE.read_bytes(), content_type="text/html", charset="utf-8")


def _newest_report(directory: Path) -> Path | None:
    reports = [
        p
        for p in directory.glob("*.report.md")
        if NAME_PATTERN.fullmatch(p.name[: -len(".report.md")]) and p.name[0] != "."
    ]
    return max(reports, key=lambda p: p.stat().st_mtime, default=None)


async def report_page(request: web.Request) -> web.Response:
    """The most recently written ``NAME.report.md`` of the calibration folder as a page:
    its reliability diagram and coverage curve, then the report's text."""
    directory = Path(request.app[SETTINGS].calibration_dir)
    report = _newest_report(directory) if directory.is_dir() else None
    if report is None:
        body = (
            f"<p>No calibration report in <code>{html.escape(str(directory))}</code> yet: "
            "run <code>python -m semif_tools calibrate DATA.jsonl --profile NAME</code>.</p>"
        )
        title = "No calibration report"
    else:
        name = report.name[: -len(".report.md")]
        figures = "".join(
            f'<img src="/playground/report/{html.escape(name)}.{kind}.png" alt="{kind}">'
            for kind in ("reliability", "coverage")
            if (directory / f"{name}.{kind}.png").is_file()
        )
        body = figures + f"<pre>{html.escape(report.read_text(encoding='utf-8'))}</pre>"
        title = f"Calibration report: {html.escape(name)}"
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f'<style>{_CSS}</style></head><body><p><a href="/playground">playground</a></p>'
        f"<h1>{title}</h1>{body}</body></html>"
    )
    return web.Response(text=page, content_type="text/html")


async def report_figure(request: web.Request) -> web.StreamResponse:
    """``NAME.reliability.png`` or ``NAME.coverage.png`` from the calibration folder; any
    other name is a 404 (no path reaches outside the folder)."""
    match = _FIGURE.fullmatch(request.match_info["file"])
    path = Path(request.app[SETTINGS].calibration_dir) / request.match_info["file"]
    if (
        match is None
        or not NAME_PATTERN.fullmatch(match["name"])
        or match["name"].startswith(".")
        or not path.is_file()
    ):
        raise NotFound(f"no calibration figure {request.match_info['file']!r}", code="not_found")
    return web.FileResponse(path, headers={"Content-Type": "image/png"})
