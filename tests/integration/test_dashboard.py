"""Every query of the Grafana dashboard names series that exist: each metric, label and
label value it uses appears in a real scrape of the proxy and of llama-server (the
"No data" panels came from queries naming series that did not)."""

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "config" / "grafana" / "decision-dashboard.json").read_text())
JOBS = {
    job["job_name"]: job
    for job in yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())["scrape_configs"]
}
# PromQL words that are not metric names
_WORDS = {
    "sum",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "avg",
    "max",
    "min",
    "count",
    "vector",
    "by",
    "without",
    "on",
    "ignoring",
    "and",
    "or",
    "unless",
}
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def selectors(expr: str) -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    """The metric selectors of a PromQL expression (name, equality matchers) and the
    labels it groups by."""
    text = re.sub(r"\[[^\]]*\]", "", expr)  # range durations
    grouped = [label.strip() for group in _GROUPING.findall(text) for label in group.split(",")]
    text = _GROUPING.sub("", text)
    found = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", text):
        name, matchers, call = m.groups()
        if call or name in _WORDS:
            continue
        found.append((name, dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers or ""))))
    return found, grouped


def test_selectors_are_found():
    expr = (
        'histogram_quantile(0.5, sum by (route, le) (rate(x_bucket{kind="decision",'
        'outcome="ok"}[$__rate_interval]))) + sum(llamacpp:requests_deferred)'
    )
    assert selectors(expr) == (
        [("x_bucket", {"kind": "decision", "outcome": "ok"}), ("llamacpp:requests_deferred", {})],
        ["route", "le"],
    )


def _scrape(url: str) -> dict[str, list[dict[str, str]]]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


@pytest.fixture(scope="module")
def scrapes(proxy_url, llama):
    questions = {
        "team": {"type": "choice", "criteria": ["billing", "shipping"]},
        "urgency": {"type": "score", "criteria": ["low", "high"]},
        "refund": {"type": "noul"},
    }
    resp = httpx.post(
        proxy_url + "/v1/systemone",
        timeout=120,
        json={"state": "My parcel is late.", "questions": questions},
    )
    assert resp.status_code == 200
    return {"proxy": _scrape(proxy_url), "llama": _scrape(llama.url)}


def _queries():
    return [
        (panel["title"], target["expr"])
        for panel in DASHBOARD["panels"]
        for target in panel["targets"]
    ]


@pytest.mark.parametrize(("title", "expr"), _queries())
def test_every_panel_query_names_series_that_exist(scrapes, title, expr):
    found, grouped = selectors(expr)
    assert found, f"{title}: no metric in {expr}"
    for name, matchers in found:
        jobs = (
            [matchers["job"]] if "job" in matchers else [j for j in scrapes if name in scrapes[j]]
        )
        assert jobs and all(j in JOBS for j in jobs), f"{title}: {name} is in no scrape"
        samples = [labels for j in jobs for labels in scrapes[j].get(name, [])]
        assert samples, f"{title}: {name} is not in the {jobs} scrape"
        for label, value in matchers.items():
            if label == "job":
                continue  # added by Prometheus from prometheus.yml
            assert any(s.get(label) == value for s in samples), (
                f"{title}: no {name} series has {label}={value!r}"
            )
    for label in grouped:
        assert any(
            label in labels
            for name, _ in found
            for j in scrapes
            for labels in scrapes[j].get(name, [])
        ), f"{title}: nothing to group by {label}"
