"""deploy/kubernetes: the base and each overlay, rendered by kustomize (kubectl's), are
valid against the Kubernetes API's schemas (kubernetes-validate, strict: no unknown
fields) and the custom resources against their CRDs' published schemas (kubernetes-models,
run with node: tests/deploy/crd); and they keep the promises the deployment rests on."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest

from proxy.config import load_settings
from proxy.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
VARIANTS = ["base", "overlays/gpu", "overlays/prometheus-adapter"]
CRD = ROOT / "tests" / "deploy" / "crd"
CUSTOM = {"monitoring.coreos.com/v1", "keda.sh/v1alpha1"}
# the oldest Kubernetes release the manifests claim to work with (every field used is GA
# there: autoscaling/v2, policy/v1, startup probes)
KUBERNETES = "1.30"


def render(variant: str | Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render deploy/kubernetes"
    out = subprocess.run(
        [kubectl, "kustomize", str(KUBE / variant)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def crd_errors(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node and (CRD / "node_modules").is_dir(), "run `make crd` (npm ci in tests/deploy/crd)"
    out = subprocess.run(
        [node, str(CRD / "validate.mjs")],
        input=json.dumps(docs),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod's long-running containers by name: its containers and native sidecars."""
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    sidecars = [c for c in spec["initContainers"] if c.get("restartPolicy") == "Always"]
    return {c["name"]: c for c in [*sidecars, *spec["containers"]]}


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


@pytest.mark.parametrize("variant", VARIANTS)
def test_core_objects_are_valid_kubernetes(variant: str):
    docs = [d for d in render(variant) if d["apiVersion"] not in CUSTOM]
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_kubernetes_schemas_catch_a_broken_deployment():
    deployment = one(render("base"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 10
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_custom_resources_match_their_published_crds(variant: str):
    custom = [d for d in render(variant) if d["apiVersion"] in CUSTOM]
    assert "ServiceMonitor" in {d["kind"] for d in custom}
    assert crd_errors(custom) == [
        {"kind": d["kind"], "name": d["metadata"]["name"], "errors": None} for d in custom
    ]


def test_the_crd_schemas_catch_broken_custom_resources():
    docs = render("base")
    monitor, scaled = one(docs, "ServiceMonitor"), one(docs, "ScaledObject")
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    scaled["spec"]["triggers"] = {"type": "prometheus"}
    report = crd_errors([monitor, scaled])
    assert "interval" in report[0]["errors"] and "triggers" in report[1]["errors"]


def test_probes_start_on_the_model_ready_on_llama_and_live_on_the_proxy_alone():
    pods = containers(render("base"))
    proxy, llama = pods["proxy"], pods["llama"]
    port = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert proxy["startupProbe"]["httpGet"]["path"] == "/health"  # 200 once the model loaded
    assert proxy["startupProbe"]["failureThreshold"] * proxy["startupProbe"]["periodSeconds"] >= 600
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/health"
    # liveness asks the proxy process alone: a llama-server restart must not kill it
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert port["http"] == int(env(proxy)["PROXY_PORT"])
    # llama-server on the pod's loopback only, probed from inside its container
    assert env(llama)["LLAMA_ARG_HOST"] == "127.0.0.1"
    health = f"http://127.0.0.1:{env(llama)['LLAMA_ARG_PORT']}/health"
    for probe in ("startupProbe", "livenessProbe"):
        assert health in llama[probe]["exec"]["command"]
    assert env(proxy)["UPSTREAM_URL"] == f"http://127.0.0.1:{env(llama)['LLAMA_ARG_PORT']}"
    assert "ports" not in llama


def test_llama_server_starts_before_the_proxy_and_stops_after_its_drain():
    spec = one(render("base"), "Deployment")["spec"]["template"]["spec"]
    # init containers run in order: the model is copied, then llama-server starts (a
    # native sidecar: the kubelet stops it only after the proxy, the main container)
    assert [c["name"] for c in spec["initContainers"]] == ["model", "llama"]
    assert spec["initContainers"][1]["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["proxy"]
    proxy = spec["containers"][0]
    wait = int(proxy["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = load_settings([], env(proxy)).shutdown_timeout_s
    assert wait + drain < spec["terminationGracePeriodSeconds"]


def test_the_proxy_environment_names_settings_it_reads():
    settings = load_settings([], env(containers(render("base"))["proxy"]))
    assert (settings.host, settings.port, settings.upstream_url) == (
        "0.0.0.0",
        8080,
        "http://127.0.0.1:8081",
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_requests_resources_and_caps_memory(variant: str):
    spec = one(render(variant), "Deployment")["spec"]["template"]["spec"]
    for container in spec["containers"] + spec["initContainers"]:
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
        assert "memory" in container["resources"]["limits"], container["name"]


def test_service_budget_and_monitor_select_the_pods_and_the_proxys_port():
    docs = render("base")
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service, budget = one(docs, "Service"), one(docs, "PodDisruptionBudget")
    monitor = one(docs, "ServiceMonitor")
    for selector in (service["spec"]["selector"], budget["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]  # never llama's
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert budget["spec"]["maxUnavailable"] == 1


def exported() -> str:
    return generate_latest(Metrics().registry).decode()


def test_keda_scales_the_deployment_on_decisions_the_proxy_exports():
    docs = render("base")
    scaled = one(docs, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(docs, "Deployment")["metadata"]["name"]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    query, metrics = trigger["metadata"]["query"], exported()
    for series in ("semif_decisions_active", "semif_decisions_queued"):
        assert series in query and f"# TYPE {series} gauge" in metrics
    assert float(trigger["metadata"]["threshold"]) < int(
        env(containers(docs)["llama"])["LLAMA_ARG_N_PARALLEL"]
    )


def test_the_adapter_overlay_replaces_keda_with_an_hpa_on_the_adapters_metric():
    docs = render("overlays/prometheus-adapter")
    assert "ScaledObject" not in {d["kind"] for d in docs}
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "semif"
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    rules = yaml.safe_load(
        (KUBE / "overlays" / "prometheus-adapter" / "adapter-rules.yaml").read_text()
    )["rules"]
    assert [r["name"]["as"] for r in rules] == [metric]
    for series in ("semif_decisions_active", "semif_decisions_queued"):
        assert series in rules[0]["metricsQuery"] and series in exported()


def test_the_gpu_overlay_gives_llama_server_a_gpu_and_the_cuda_build():
    cpu, gpu = containers(render("base")), containers(render("overlays/gpu"))
    assert gpu["llama"]["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434"
    assert gpu["llama"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env(gpu["llama"])["LLAMA_ARG_N_GPU_LAYERS"] == "999"
    # large batches on a GPU (llama-server's default -ub), and the proxy told 0 (unknown)
    assert env(gpu["llama"])["LLAMA_ARG_UBATCH"] == "512"
    assert env(gpu["proxy"])["PROXY_UPSTREAM_UBATCH"] == "0"
    kept = {k: v for k, v in env(cpu["llama"]).items() if k != "LLAMA_ARG_UBATCH"}
    assert env(gpu["llama"]).items() >= kept.items()  # the rest kept
    proxy_env = {k: v for k, v in env(cpu["proxy"]).items() if k != "PROXY_UPSTREAM_UBATCH"}
    assert env(gpu["proxy"]).items() >= proxy_env.items()
    assert {**gpu["proxy"], "env": None} == {**cpu["proxy"], "env": None}
    spec = one(render("overlays/gpu"), "Deployment")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_the_images_are_the_official_llama_build_and_ours():
    images = {c["name"]: c["image"] for c in containers(render("base")).values()}
    assert images["llama"] == "ghcr.io/ggml-org/llama.cpp:server-b11434"
    assert images["proxy"].startswith("semif-proxy:")
