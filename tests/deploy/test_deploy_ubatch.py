"""llama-server's physical batch (-ub) and what the proxy is told of it (PROXY_UPSTREAM_UBATCH)
agree in every deployment we ship: compose, the Kubernetes base and overlays, the
CloudFormation template (each layout, each instance type), ``python -m deploy``'s three
layouts and the single image's entrypoint. On CPU both are 63, as ``make run`` starts them
(scripts/stack.py), so the proxy reads new conversations in one request, bit for bit
repeatable (docs/repeatability.md); on GPU llama-server keeps large batches and the proxy is
told 0 (unknown)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfnlint.decode.cfn_yaml import loads

from deploy import deploy
from proxy.config import load_settings
from scripts.stack import UBATCH
from tests.deploy.test_deploy_entrypoints import SINGLE, run
from tests.deploy.test_deploy_kubernetes import containers, env, render

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
COMPOSE_GPU = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())
TEMPLATE = loads((ROOT / "deploy" / "sagemaker.yaml").read_text())
INSTANCE_TYPES = TEMPLATE["Parameters"]["InstanceType"]["AllowedValues"]
CPU, GPU = "ml.c7i.xlarge", "ml.g5.xlarge"
# llama-server b11434's long flags (llama-server --help) for what python -m deploy sets
LLAMA_SERVER_FLAGS = {"--parallel", "--ctx-size", "--ubatch-size", "--n-gpu-layers"}
# the DLC's own variables, not turned into flags (docs/sagemaker.md)
DLC_CONTROLS = {"SM_LLAMA_CPP_PORT", "SM_LLAMA_CPP_MODEL", "SM_LLAMA_CPP_MODEL_DIR"}

Pair = tuple[str, str]  # (llama-server's -ub, the proxy's PROXY_UPSTREAM_UBATCH)


def single_image(environment: dict[str, str], tmp: Path) -> Pair:
    """What the single image's two processes are started with, given the container's
    environment: read from the commands the entrypoint hands a fake supervisord."""
    code, _, seen = run(SINGLE, ["serve"], {"SUPERVISORD": str(tmp / "fake"), **environment}, tmp)
    assert code == 0 and seen is not None
    llama = dict(w.split("=", 1) for w in seen["SEMIF_LLAMA_COMMAND"].split() if "=" in w)
    proxy = dict(w.split("=", 1) for w in seen["SEMIF_PROXY_COMMAND"].split() if "=" in w)
    return llama["LLAMA_ARG_UBATCH"], proxy["PROXY_UPSTREAM_UBATCH"]


# compose


def interpolate(value: Any, shell: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` (unset or empty: the default) against ``shell``."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: shell.get(m[1]) or m[2], str(value))


def compose(gpu: bool, shell: dict[str, str]) -> Pair:
    services = COMPOSE["services"]
    llama, proxy = dict(services["llama"]["environment"]), dict(services["proxy"]["environment"])
    assert "command" not in services["llama"]  # no flag after the entrypoint overrides the env
    if gpu:  # docker compose -f docker-compose.yml -f docker-compose.gpu.yml
        llama.update(COMPOSE_GPU["services"]["llama"]["environment"])
        proxy.update(COMPOSE_GPU["services"]["proxy"]["environment"])
    return (interpolate(llama["LLAMA_ARG_UBATCH"], shell),
            interpolate(proxy["PROXY_UPSTREAM_UBATCH"], shell))


# Kubernetes


def kubernetes(variant: str) -> Pair:
    pods = containers(render(variant))
    llama, proxy = pods["llama"], pods["proxy"]
    assert not {"command", "args"} & set(llama)  # the image's llama-server, flags from env
    return env(llama)["LLAMA_ARG_UBATCH"], env(proxy)["PROXY_UPSTREAM_UBATCH"]


# CloudFormation


def condition(value: Any, params: dict[str, str]) -> bool:
    if "Condition" in value:
        return condition(TEMPLATE["Conditions"][value["Condition"]], params)
    (name, args), = value.items()
    if name == "Fn::Equals":
        a, b = (resolve(x, params) for x in args)
        return a == b
    if name == "Fn::Or":
        return any(condition(x, params) for x in args)
    if name == "Fn::And":
        return all(condition(x, params) for x in args)
    if name == "Fn::Not":
        return not condition(args[0], params)
    raise AssertionError(f"condition {name} is not evaluated here")


def resolve(value: Any, params: dict[str, str]) -> Any:
    """The template's value with its parameters given: Ref and Fn::If resolved, AWS::NoValue
    dropped (None)."""
    if isinstance(value, dict):
        if value == {"Ref": "AWS::NoValue"}:
            return None
        if set(value) == {"Ref"}:
            return params[value["Ref"]]
        if set(value) == {"Fn::If"}:
            name, then, otherwise = value["Fn::If"]
            chosen = condition(TEMPLATE["Conditions"][name], params)
            return resolve(then if chosen else otherwise, params)
        out = {k: resolve(v, params) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(value, list):
        return [v for v in (resolve(x, params) for x in value) if v is not None]
    return str(value)


def cloudformation(layout: str, instance_type: str, tmp: Path) -> Pair:
    params = {name: str(p.get("Default", "")) for name, p in TEMPLATE["Parameters"].items()}
    params.update(Layout=layout, InstanceType=instance_type, SingleImageUri="s",
                  ProxyImageUri="p", LlamaImageUri="l")
    model = resolve(TEMPLATE["Resources"]["Model"]["Properties"], params)
    if layout == "single":
        return single_image(model["PrimaryContainer"]["Environment"], tmp)
    proxy, llama = model["Containers"]
    assert (proxy["ContainerHostname"], llama["ContainerHostname"]) == ("proxy", "llama")
    return llama["Environment"]["LLAMA_ARG_UBATCH"], proxy["Environment"]["PROXY_UPSTREAM_UBATCH"]


# python -m deploy


def dlc_flags(environment: dict[str, str]) -> dict[str, str]:
    """The AWS llama.cpp DLC's translation: SM_LLAMA_CPP_FOO_BAR=v is --foo-bar v."""
    prefix = "SM_LLAMA_CPP_"
    return {"--" + k[len(prefix):].lower().replace("_", "-"): v for k, v in environment.items()
            if k.startswith(prefix) and k not in DLC_CONTROLS}


def config(layout: str, instance_type: str) -> deploy.DeployConfig:
    images = {"single": {"image": "s"}, "two": {"proxy_image": "p", "llama_image": "l"},
              "dlc": {"proxy_image": "p", "llama_dlc": True}}[layout]
    return deploy.DeployConfig(name="semif", model_data="s3://b/m.tar.gz",
                               role="arn:aws:iam::123456789012:role/r",
                               instance_type=instance_type, **images)


def python_deploy(layout: str, instance_type: str, tmp: Path) -> Pair:
    request = deploy.model_request(config(layout, instance_type))
    if layout == "single":
        return single_image(request["PrimaryContainer"]["Environment"], tmp)
    proxy, llama = request["Containers"]
    if layout == "dlc":
        return dlc_flags(llama["Environment"])["--ubatch-size"], proxy["Environment"][
            "PROXY_UPSTREAM_UBATCH"]
    return llama["Environment"]["LLAMA_ARG_UBATCH"], proxy["Environment"]["PROXY_UPSTREAM_UBATCH"]


def batch_transform(instance_type: str, tmp: Path) -> Pair:
    """The model ``python -m deploy transform --image`` creates (the single image)."""
    job = deploy.TransformConfig(name="j", input="s3://b/i/", output="s3://b/o/", image="s",
                                 model_data="s3://b/m.tar.gz",
                                 role="arn:aws:iam::123456789012:role/r",
                                 instance_type=instance_type)
    request = deploy.model_request(job.model_config())
    return single_image(request["PrimaryContainer"]["Environment"], tmp)


Layout = Callable[[Path], Pair]
LAYOUTS: list[tuple[str, bool, Layout]] = [
    ("compose", False, lambda tmp: compose(False, {})),
    ("compose-gpu", True, lambda tmp: compose(True, {})),
    ("kubernetes-base", False, lambda tmp: kubernetes("base")),
    ("kubernetes-prometheus-adapter", False, lambda tmp: kubernetes("overlays/prometheus-adapter")),
    ("kubernetes-gpu", True, lambda tmp: kubernetes("overlays/gpu")),
    *[(f"cloudformation-{layout}-{instance}", deploy.is_gpu(instance),
       lambda tmp, layout=layout, instance=instance: cloudformation(layout, instance, tmp))
      for layout in ("single", "two") for instance in INSTANCE_TYPES],
    *[(f"deploy-{layout}-{instance}", deploy.is_gpu(instance),
       lambda tmp, layout=layout, instance=instance: python_deploy(layout, instance, tmp))
      for layout in ("single", "two", "dlc") for instance in (CPU, GPU)],
    *[(f"transform-{instance}", deploy.is_gpu(instance),
       lambda tmp, instance=instance: batch_transform(instance, tmp)) for instance in (CPU, GPU)],
    ("single-image-defaults", False, lambda tmp: single_image({}, tmp)),
]


@pytest.mark.parametrize(("gpu", "layout"), [(gpu, fn) for _, gpu, fn in LAYOUTS],
                         ids=[name for name, _, _ in LAYOUTS])
def test_llama_servers_ubatch_and_the_proxys_agree(gpu: bool, layout: Layout, tmp_path: Path):
    llama, proxy = layout(tmp_path)
    if gpu:  # large batches; the repeatable read is the CPU kernels' (docs/repeatability.md)
        assert (llama, proxy) == ("512", "0")
    else:  # as make run starts them
        assert llama == proxy == str(UBATCH)
    assert load_settings([], {"PROXY_UPSTREAM_UBATCH": proxy}).upstream_ubatch == int(proxy)


def test_the_templates_gpu_condition_is_deploy_pys():
    assert {t for t in INSTANCE_TYPES if deploy.is_gpu(t)} >= {"ml.g5.xlarge", "ml.g6.xlarge"}
    for instance in INSTANCE_TYPES:
        params = {"InstanceType": instance}
        assert condition({"Condition": "Gpu"}, params) == deploy.is_gpu(instance), instance


@pytest.mark.parametrize("shell", [{"LLAMA_ARG_UBATCH": "32"}, {"LLAMA_ARG_UBATCH": ""}])
def test_one_compose_variable_sets_both(shell: dict[str, str]):
    expected = shell["LLAMA_ARG_UBATCH"] or str(UBATCH)
    assert compose(False, shell) == (expected, expected)


@pytest.mark.parametrize("instance", [CPU, GPU])
def test_the_dlcs_variables_spell_flags_llama_server_has(instance: str):
    _, llama = deploy.model_request(config("dlc", instance))["Containers"]
    flags = dlc_flags(llama["Environment"])
    assert set(flags) <= LLAMA_SERVER_FLAGS
    assert {"--parallel", "--ctx-size", "--ubatch-size"} <= set(flags)


@pytest.mark.parametrize(("environment", "pair"), [
    ({"LLAMA_ARG_UBATCH": "32"}, ("32", "32")),  # the proxy follows llama-server
    ({"LLAMA_ARG_UBATCH": "512", "PROXY_UPSTREAM_UBATCH": "0"}, ("512", "0")),  # GPU: unknown
    ({"PROXY_UPSTREAM_UBATCH": "0"}, (str(UBATCH), "0")),
    ({"LLAMA_ARG_UBATCH": "48", "PROXY_UPSTREAM_UBATCH": "48"}, ("48", "48")),
])
def test_the_single_image_tells_the_proxy_llama_servers_ubatch(environment, pair, tmp_path):
    assert single_image(environment, tmp_path) == pair


@pytest.mark.parametrize("environment", [
    {"LLAMA_ARG_UBATCH": "512", "PROXY_UPSTREAM_UBATCH": "63"},
    {"PROXY_UPSTREAM_UBATCH": "32"},  # llama-server would run with 63
    {"LLAMA_ARG_UBATCH": "sixty"},
    {"LLAMA_ARG_UBATCH": "0"},
])
def test_the_single_image_refuses_a_proxy_told_another_ubatch(environment, tmp_path):
    code, argv, _ = run(SINGLE, ["serve"], {"SUPERVISORD": str(tmp_path / "fake"), **environment},
                        tmp_path)
    assert code == 64 and argv is None
