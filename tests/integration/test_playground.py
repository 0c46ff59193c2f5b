"""The decision playground in a real headless browser (Debian's chromium), and the
calibration report page beside it."""

import html
import re
import shutil
import subprocess
from urllib.parse import urlencode

import httpx
import pytest

from scripts.stack import stop
from semif_tools.calibrate.fit import Labelled
from semif_tools.calibrate.profile_fit import fit_profile
from semif_tools.calibrate.report import write_report
from tests.conftest import launch_proxy

OPTIONS = ["billing", "shipping", "technical"]
TEXT = "I was charged twice for my order last week."


def _browser() -> str:
    found = shutil.which("chromium")
    if found is None:  # installed by `make test` (scripts/prepare.py browser): never skipped
        pytest.fail("chromium is missing: run `python scripts/prepare.py browser`")
    return found


def _rendered(url: str) -> str:
    """The page's DOM once its script has run, from chromium's --dump-dom."""
    done = subprocess.run(
        [
            _browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=60000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_page_draws_one_bar_per_option_with_the_proxys_probabilities(proxy_url):
    query = urlencode({"text": TEXT, "options": "|".join(OPTIONS), "run": "1"})
    dom = _rendered(f"{proxy_url}/playground?{query}")
    bars = [
        (
            re.search(r"width: ([\d.]+)%", tag).group(1),
            re.search(r'data-probability="([^"]+)"', tag).group(1),
        )
        for tag in re.findall(r'<div class="bar"[^>]*>', dom)
    ]
    names = [html.unescape(n) for n in re.findall(r'<span class="name">([^<]*)</span>', dom)]
    assert names == OPTIONS, dom[-3000:]
    assert len(bars) == 3
    probs = [float(p) for _, p in bars]
    assert [float(w) for w, _ in bars] == pytest.approx([100 * p for p in probs], abs=0.01)
    assert sum(probs) == pytest.approx(1.0, abs=1e-9)
    # the same question asked directly: the bars are the proxy's own numbers (repeatable)
    answer = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=120,
        json={"state": TEXT, "questions": {"q": {"type": "choice", "criteria": OPTIONS}}},
    ).json()
    assert probs == pytest.approx(
        [answer["answers"]["q"]["probabilities"][n] for n in OPTIONS], rel=1e-12
    )
    chosen = re.search(r'<div class="row chosen"><span class="name">([^<]*)</span>', dom)
    assert chosen and chosen.group(1) == answer["answers"]["q"]["choice"]
    assert re.search(r'id="facts">label mass [\d.]+% · reads \d+', dom)


def test_a_refused_question_is_shown_as_the_error(proxy_url):
    dom = _rendered(
        f"{proxy_url}/playground?" + urlencode({"text": TEXT, "options": "only", "run": "1"})
    )
    assert 'id="error"' in dom and "422" in dom and 'class="bar"' not in dom


@pytest.fixture(scope="module")
def with_report(llama, logs_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("reports")
    readings = [Labelled("choice", (0.7, 0.2, 0.1), i % 3, 0.9) for i in range(60)]
    fitted = fit_profile(
        readings,
        name="tickets",
        model="m.gguf",
        prompt_format_version="semif-1",
        data_sha256="0" * 64,
    )
    write_report(folder, fitted.profile, fitted.fit)
    proc, url, log = launch_proxy(logs_dir, llama.url, "--calibration-dir", str(folder))
    yield url
    stop(proc)
    log.close()


def test_the_report_page_shows_the_newest_reports_figures(with_report):
    page = httpx.get(with_report + "/playground/report").text
    assert "Calibration report: tickets" in page
    for kind in ("reliability", "coverage"):
        assert f'<img src="/playground/report/tickets.{kind}.png"' in page
        figure = httpx.get(f"{with_report}/playground/report/tickets.{kind}.png")
        assert figure.status_code == 200 and figure.content[:8] == b"\x89PNG\r\n\x1a\n"
        assert figure.headers["Content-Type"] == "image/png"


@pytest.mark.parametrize(
    "name",
    [
        "tickets.json",
        "..%2Ftickets.reliability.png",
        ".hidden.coverage.png",
        "other.reliability.png",
    ],
)
def test_only_report_figures_are_served(with_report, name):
    resp = httpx.get(f"{with_report}/playground/report/{name}")
    assert resp.status_code == 404


def test_the_page_is_open_and_the_report_follows_the_key(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url, "--api-key", "k")
    try:
        assert httpx.get(url + "/playground").status_code == 200
        assert httpx.get(url + "/playground/report").status_code == 401
        assert (
            httpx.get(url + "/playground/report", headers={"Authorization": "Bearer k"}).status_code
            == 200
        )
    finally:
        stop(proc)
        log.close()
