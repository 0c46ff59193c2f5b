"""The docs hold together: every relative link and anchor resolves, the settings table is
the one ``proxy/config.py`` renders, the README stays a page a user reads in five minutes,
and nothing points outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from scripts import settings_doc

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a link or heading there is not one)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("    "):
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than
    '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(page.read_text()):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [m.group(1) for line in _prose(page.read_text()) for m in _LINK.finditer(line)]


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("Quick start", "quick-start"),
        ("Which llama-server, and why", "which-llama-server-and-why"),
        ("`POST /v1/systemone`: System One", "post-v1systemone-system-one"),
        (
            "Calibration: probabilities you can set a threshold on",
            "calibration-probabilities-you-can-set-a-threshold-on",
        ),
        ("snake_case and [a link](x.md)", "snake_case-and-a-link"),
    ],
)
def test_slug_follows_githubs_rules(heading, expected):
    assert slug(heading) == expected


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[ok](#title) [gone](missing.md) [bad](#nowhere)\n"
        "```\n[in code](not-checked.md)\n```\n"
    )
    assert links(page) == ["#title", "missing.md", "#nowhere"]
    assert anchors(page) == {"title"}


def test_the_settings_tables_are_the_ones_the_settings_render():
    readme = (ROOT / "README.md").read_text()
    assert settings_doc.render_readme(readme) == readme, (
        "README.md's settings table is stale: run python scripts/settings_doc.py"
    )
    assert (
        ROOT / "docs" / "configuration.md"
    ).read_text() == settings_doc.render_configuration(), (
        "docs/configuration.md is stale: run python scripts/settings_doc.py"
    )


def test_every_setting_is_in_the_table():
    from dataclasses import fields

    from proxy.config import Settings

    table = settings_doc.table()
    assert all(f"`--{f.name.replace('_', '-')}`" in table for f in fields(Settings))
    assert table.count("\n") == len(fields(Settings)) + 1


def test_the_readme_is_short_and_narrow():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    wide = [f"{i}: {len(line)}" for i, line in enumerate(lines, 1) if len(line) > 100]
    assert not wide, f"README.md lines over 100 characters: {wide}"


def test_nothing_points_outside_the_repository():
    facts = "FAC" + "TS"  # the outside file's name, spelled so that this line is no hit
    found = subprocess.run(
        ["git", "grep", "-n", "-e", r"\.\./shared", "-e", facts],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert not found.stdout, found.stdout


def test_the_route_table_is_the_one_the_route_lists_render():
    from scripts import llama_routes, routes_doc

    text = (ROOT / "docs" / "operations.md").read_text()
    assert routes_doc.render(text, llama_routes.read()) == text, (
        "docs/operations.md's route table is stale: run python scripts/routes_doc.py"
    )
