"""docker-compose.yml against the Compose Specification's JSON schema, plus the wiring
between its services, Prometheus' scrape targets and the Grafana dashboard.

compose-spec.json is the schema of compose-spec/compose-spec (``schema/compose-spec.json``,
master), as vendored in check-jsonschema 0.39.0 (sha256 d549057e...0e64).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((Path(__file__).with_name("compose-spec.json")).read_text())
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PROMETHEUS = yaml.safe_load((ROOT / "config" / "prometheus.yml").read_text())
DASHBOARD = json.loads((ROOT / "config" / "grafana" / "decision-dashboard.json").read_text())


def schema_errors(document: dict) -> list[str]:
    validator = jsonschema.validators.validator_for(SCHEMA)(SCHEMA)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def test_vendored_schema_is_a_valid_schema():
    jsonschema.validators.validator_for(SCHEMA).check_schema(SCHEMA)
    assert SCHEMA["title"] == "Compose Specification"


def test_compose_file_follows_the_specification():
    assert schema_errors(COMPOSE) == []


def _typo(doc):
    doc["services"]["proxy"]["helthcheck"] = doc["services"]["proxy"].pop("depends_on")


def _bad_condition(doc):
    doc["services"]["proxy"]["depends_on"]["llama"]["condition"] = "service_ready"


def _ports_as_mapping(doc):
    doc["services"]["proxy"]["ports"] = {"8080": 8080}


@pytest.mark.parametrize("breakage", [_typo, _bad_condition, _ports_as_mapping])
def test_the_schema_catches_broken_variants(breakage):
    broken = copy.deepcopy(COMPOSE)
    breakage(broken)
    assert schema_errors(broken) != []


def test_services_and_their_wiring():
    services = COMPOSE["services"]
    assert set(services) == {"llama", "proxy", "prometheus", "grafana"}
    llama, proxy = services["llama"], services["proxy"]
    assert llama["build"]["dockerfile"] == "Dockerfile.llama"
    assert proxy["build"]["dockerfile"] == "Dockerfile.proxy"
    assert "./models:/opt/ml/model:ro" in llama["volumes"]
    assert llama["environment"]["LLAMA_ARG_PORT"] == "8081"
    assert "http://127.0.0.1:8081/health" in llama["healthcheck"]["test"]
    assert proxy["environment"]["UPSTREAM_URL"] == "http://llama:8081"
    assert proxy["depends_on"]["llama"]["condition"] == "service_healthy"
    assert any(str(p).endswith(":8080:8080") or str(p) == "8080:8080" for p in proxy["ports"])


def test_prometheus_is_pinned_and_scrapes_both():
    prometheus = COMPOSE["services"]["prometheus"]
    image, _, tag = prometheus["image"].partition(":")
    assert image == "prom/prometheus" and tag.startswith("v") and tag != "latest"
    assert "./config/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    targets = {
        t
        for job in PROMETHEUS["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    assert targets == {"proxy:8080", "llama:8081"}


def _expressions() -> list[str]:
    return [t["expr"] for panel in DASHBOARD["panels"] for t in panel["targets"]]


@pytest.mark.parametrize(
    ("metric", "grouping"),
    [
        (
            'semif_request_duration_seconds_bucket{kind="decision",outcome="ok"}',
            "sum by (route, le)",
        ),
        ("semif_decision_confidence_ratio_bucket", "sum by (le)"),
        ("semif_label_mass_ratio_bucket", "sum by (le)"),
        ("semif_upstream_errors_total", "sum by (kind)"),
        ('semif_client_errors_total{reason="overloaded"}', "sum("),
        ("semif_decisions_queued", "sum("),
        ("semif_decisions_total", "sum by (type)"),
        ("llamacpp:requests_processing", "sum("),
    ],
)
def test_dashboard_charts_each_metric(metric: str, grouping: str):
    exprs = [e for e in _expressions() if metric in e]
    assert exprs, f"no panel uses {metric}"
    assert any(grouping in e for e in exprs)


def test_latency_panels_count_decisions_only():
    latency = [e for e in _expressions() if "semif_request_duration_seconds" in e]
    assert latency and all(
        'kind="decision"' in e and e.startswith("histogram_quantile(") for e in latency
    )


def _volume(service: dict, target: str) -> Path:
    source = next(v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == target)
    return ROOT / source


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard():
    grafana = COMPOSE["services"]["grafana"]
    image, _, tag = grafana["image"].partition(":")
    assert image == "grafana/grafana-oss" and tag[0].isdigit()
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_started"
    provisioning = _volume(grafana, "/etc/grafana/provisioning")
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    prometheus_port = COMPOSE["services"]["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == f"http://prometheus:{prometheus_port}"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "semif.yml").read_text())
    (provider,) = dashboards["providers"]
    assert dashboards["apiVersion"] == 1 and provider["type"] == "file"
    folder = provider["options"]["path"]
    mounted = [v for v in grafana["volumes"] if v.split(":")[1].startswith(folder + "/")]
    assert mounted and all((ROOT / v.split(":")[0]).is_file() for v in mounted)
    assert (
        json.loads(_volume(grafana, mounted[0].split(":")[1]).read_text())["uid"]
        == DASHBOARD["uid"]
    )
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in [v.split(":")[1] for v in mounted]


def test_dashboard_panels_are_distinct_and_use_the_datasource_variable():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    assert {p["datasource"]["uid"] for p in DASHBOARD["panels"]} == {"${datasource}"}
    assert DASHBOARD["templating"]["list"][0]["query"] == "prometheus"


def _merged(base: dict, override: dict) -> dict:
    """Compose's merge of an override file, for mappings (what the GPU file uses)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = (
            _merged(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else copy.deepcopy(value)
        )
    return out


def test_the_gpu_variant_reserves_a_gpu_and_offloads_the_model():
    gpu = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())
    merged = _merged(COMPOSE, gpu)
    assert schema_errors(merged) == [] and schema_errors(gpu) == []
    llama = merged["services"]["llama"]
    assert llama["build"]["args"]["LLAMA_TAG"] == "server-cuda-b11434"
    assert llama["build"]["dockerfile"] == "Dockerfile.llama"  # the rest of the base kept
    assert llama["environment"]["LLAMA_ARG_N_GPU_LAYERS"] == "999"
    assert llama["environment"]["LLAMA_ARG_PORT"] == "8081"
    (device,) = llama["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert set(merged["services"]) == set(COMPOSE["services"])
