"""llama-server's physical batch (-ub) and what the proxy is told of it (PROXY_UPSTREAM_UBATCH)
agree in every deployment we ship: compose, the Kubernetes base and overlays, the
CloudFormation template (each layout, each instance type), ``python -m deploy``'s three
layouts and the single image's entrypoint. On CPU both are 63, as ``make run`` starts them
(scripts/stack.py), so the proxy reads new conversations in one request, bit for bit
repeatable (docs/repeatability.md); on GPU llama-server keeps large batches and the proxy is
told 0 (unknown). In every one of them, CPU and GPU, llama-server's host-memory prompt cache
is off (``--cache-ram 0``, as scripts/stack.py starts it), which would otherwise move saved
states between slots under the proxy's reads."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfnlint.decode.cfn_yaml import loads

from deploy import deploy
from proxy.config import load_settings
from scripts.stack import LLAMA_FLAGS, UBATCH
from tests.deploy.test_deploy_entrypoints import SINGLE, run
from tests.deploy.test_deploy_kubernetes import containers, env, render

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
COMPOSE_GPU = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())
TEMPLATE = loads((ROOT / "deploy" / "sagemaker.yaml").read_text())
INSTANCE_TYPES = TEMPLATE["Parameters"]["InstanceType"]["AllowedValues"]
CPU, GPU = "ml.c7i.xlarge", "ml.g5.xlarge"
# llama-server b11434's long flags for what python -m deploy sets, and the variable each
# reads from (llama-server --help: "(env: LLAMA_ARG_...)")
LLAMA_SERVER_FLAGS = {
    "--parallel": "LLAMA_ARG_N_PARALLEL",
    "--ctx-size": "LLAMA_ARG_CTX_SIZE",
    "--ubatch-size": "LLAMA_ARG_UBATCH",
    "--cache-ram": "LLAMA_ARG_CACHE_RAM",
    "--n-gpu-layers": "LLAMA_ARG_N_GPU_LAYERS",
}
# the DLC's own variables, not turned into flags (docs/sagemaker.md)
DLC_CONTROLS = {"SM_LLAMA_CPP_PORT", "SM_LLAMA_CPP_MODEL", "SM_LLAMA_CPP_MODEL_DIR"}

# the environments llama-server and the proxy start with (for the DLC, llama-server's flags
# spelled as the LLAMA_ARG_* variables they stand for)
Started = tuple[dict[str, str], dict[str, str]]


def command_environment(command: str, inherited: dict[str, str]) -> dict[str, str]:
    """The environment ``env [-u NAME]... [NAME=VALUE]... PROGRAM`` starts PROGRAM with."""
    words = command.split()
    assert words[0] == "env"
    out = dict(inherited)
    i = 1
    while i < len(words) and (words[i] == "-u" or "=" in words[i]):
        if words[i] == "-u":
            out.pop(words[i + 1], None)
            i += 2
        else:
            name, value = words[i].split("=", 1)
            out[name] = value
            i += 1
    assert i == len(words) - 1, command  # the program, no arguments (which would beat the env)
    return out


def single_image(environment: dict[str, str], tmp: Path) -> Started:
    """What the single image's two processes are started with, given the container's
    environment: read from the commands the entrypoint hands a fake supervisord (whose
    environment its programs inherit)."""
    code, _, seen = run(SINGLE, ["serve"], {"SUPERVISORD": str(tmp / "fake"), **environment}, tmp)
    assert code == 0 and seen is not None
    return (
        command_environment(seen["SEMIF_LLAMA_COMMAND"], seen),
        command_environment(seen["SEMIF_PROXY_COMMAND"], seen),
    )


# compose


def interpolate(value: Any, shell: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` (unset or empty: the default) against ``shell``."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: shell.get(m[1]) or m[2], str(value))


def compose(gpu: bool, shell: dict[str, str]) -> Started:
    services = COMPOSE["services"]
    llama, proxy = dict(services["llama"]["environment"]), dict(services["proxy"]["environment"])
    assert "command" not in services["llama"]  # no flag after the entrypoint overrides the env
    if gpu:  # docker compose -f docker-compose.yml -f docker-compose.gpu.yml
        assert "command" not in COMPOSE_GPU["services"]["llama"]
        llama.update(COMPOSE_GPU["services"]["llama"]["environment"])
        proxy.update(COMPOSE_GPU["services"]["proxy"]["environment"])
    return (
        {k: interpolate(v, shell) for k, v in llama.items()},
        {k: interpolate(v, shell) for k, v in proxy.items()},
    )


# Kubernetes


def kubernetes(variant: str) -> Started:
    pods = containers(render(variant))
    llama, proxy = pods["llama"], pods["proxy"]
    assert not {"command", "args"} & set(llama)  # the image's llama-server, flags from env
    return env(llama), env(proxy)


# CloudFormation


def condition(value: Any, params: dict[str, str]) -> bool:
    if "Condition" in value:
        return condition(TEMPLATE["Conditions"][value["Condition"]], params)
    ((name, args),) = value.items()
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


def cloudformation_model(layout: str, instance_type: str) -> dict[str, Any]:
    params = {name: str(p.get("Default", "")) for name, p in TEMPLATE["Parameters"].items()}
    params.update(
        Layout=layout,
        InstanceType=instance_type,
        SingleImageUri="s",
        ProxyImageUri="p",
        LlamaImageUri="l",
    )
    return resolve(TEMPLATE["Resources"]["Model"]["Properties"], params)


def cloudformation(layout: str, instance_type: str, tmp: Path) -> Started:
    model = cloudformation_model(layout, instance_type)
    if layout == "single":
        return single_image(model["PrimaryContainer"]["Environment"], tmp)
    proxy, llama = model["Containers"]
    assert (proxy["ContainerHostname"], llama["ContainerHostname"]) == ("proxy", "llama")
    return llama["Environment"], proxy["Environment"]


# python -m deploy


def dlc_flags(environment: dict[str, str]) -> dict[str, str]:
    """The AWS llama.cpp DLC's translation: SM_LLAMA_CPP_FOO_BAR=v is --foo-bar v."""
    prefix = "SM_LLAMA_CPP_"
    return {
        "--" + k[len(prefix) :].lower().replace("_", "-"): v
        for k, v in environment.items()
        if k.startswith(prefix) and k not in DLC_CONTROLS
    }


def config(layout: str, instance_type: str) -> deploy.DeployConfig:
    images = {
        "single": {"image": "s"},
        "two": {"proxy_image": "p", "llama_image": "l"},
        "dlc": {"proxy_image": "p", "llama_dlc": True},
    }[layout]
    return deploy.DeployConfig(
        name="semif",
        model_data="s3://b/m.tar.gz",
        role="arn:aws:iam::123456789012:role/r",
        instance_type=instance_type,
        **images,
    )


def python_deploy(layout: str, instance_type: str, tmp: Path) -> Started:
    request = deploy.model_request(config(layout, instance_type))
    if layout == "single":
        return single_image(request["PrimaryContainer"]["Environment"], tmp)
    proxy, llama = request["Containers"]
    if layout == "dlc":
        flags = dlc_flags(llama["Environment"])
        return {LLAMA_SERVER_FLAGS[f]: v for f, v in flags.items()}, proxy["Environment"]
    return llama["Environment"], proxy["Environment"]


def transform_model(instance_type: str) -> dict[str, Any]:
    """The model ``python -m deploy transform --image`` creates (the single image)."""
    job = deploy.TransformConfig(
        name="j",
        input="s3://b/i/",
        output="s3://b/o/",
        image="s",
        model_data="s3://b/m.tar.gz",
        role="arn:aws:iam::123456789012:role/r",
        instance_type=instance_type,
    )
    return deploy.model_request(job.model_config())


def batch_transform(instance_type: str, tmp: Path) -> Started:
    return single_image(transform_model(instance_type)["PrimaryContainer"]["Environment"], tmp)


Layout = Callable[[Path], Started]
LAYOUTS: list[tuple[str, bool, Layout]] = [
    ("compose", False, lambda tmp: compose(False, {})),
    ("compose-gpu", True, lambda tmp: compose(True, {})),
    ("kubernetes-base", False, lambda tmp: kubernetes("base")),
    ("kubernetes-prometheus-adapter", False, lambda tmp: kubernetes("overlays/prometheus-adapter")),
    ("kubernetes-gpu", True, lambda tmp: kubernetes("overlays/gpu")),
    *[
        (
            f"cloudformation-{layout}-{instance}",
            deploy.is_gpu(instance),
            lambda tmp, layout=layout, instance=instance: cloudformation(layout, instance, tmp),
        )
        for layout in ("single", "two")
        for instance in INSTANCE_TYPES
    ],
    *[
        (
            f"deploy-{layout}-{instance}",
            deploy.is_gpu(instance),
            lambda tmp, layout=layout, instance=instance: python_deploy(layout, instance, tmp),
        )
        for layout in ("single", "two", "dlc")
        for instance in (CPU, GPU)
    ],
    *[
        (
            f"transform-{instance}",
            deploy.is_gpu(instance),
            lambda tmp, instance=instance: batch_transform(instance, tmp),
        )
        for instance in (CPU, GPU)
    ],
    ("single-image-defaults", False, lambda tmp: single_image({}, tmp)),
]


@pytest.mark.parametrize(
    ("gpu", "layout"), [(gpu, fn) for _, gpu, fn in LAYOUTS], ids=[name for name, _, _ in LAYOUTS]
)
def test_llama_servers_ubatch_and_the_proxys_agree(gpu: bool, layout: Layout, tmp_path: Path):
    llama_env, proxy_env = layout(tmp_path)
    llama, proxy = llama_env["LLAMA_ARG_UBATCH"], proxy_env["PROXY_UPSTREAM_UBATCH"]
    if gpu:  # large batches; the repeatable read is the CPU kernels' (docs/repeatability.md)
        assert (llama, proxy) == ("512", "0")
    else:  # as make run starts them
        assert llama == proxy == str(UBATCH)
    assert load_settings([], {"PROXY_UPSTREAM_UBATCH": proxy}).upstream_ubatch == int(proxy)


@pytest.mark.parametrize(
    "layout", [fn for _, _, fn in LAYOUTS], ids=[name for name, _, _ in LAYOUTS]
)
def test_llama_servers_ram_prompt_cache_is_off(layout: Layout, tmp_path: Path):
    # CPU and GPU alike: with the cache on, llama-server moves a saved state into another
    # slot, which the proxy sees as an unexpected reuse (the prompt read twice); a restored
    # state can end in a row evaluated alone, which a longer prompt must not build on
    llama_env, _ = layout(tmp_path)
    assert llama_env.get("LLAMA_ARG_CACHE_RAM") == "0"


# the single image's container environment as each layout that runs it sets it
SINGLE_IMAGE_MODELS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    *[
        (
            f"cloudformation-{instance}",
            lambda instance=instance: cloudformation_model("single", instance),
        )
        for instance in INSTANCE_TYPES
    ],
    *[
        (
            f"deploy-{instance}",
            lambda instance=instance: deploy.model_request(config("single", instance)),
        )
        for instance in (CPU, GPU)
    ],
    *[
        (f"transform-{instance}", lambda instance=instance: transform_model(instance))
        for instance in (CPU, GPU)
    ],
]


@pytest.mark.parametrize(
    "model", [fn for _, fn in SINGLE_IMAGE_MODELS], ids=[name for name, _ in SINGLE_IMAGE_MODELS]
)
def test_the_single_image_is_told_so_too(model: Callable[[], dict[str, Any]]):
    # not left to the entrypoint's default: an image pushed before it had one runs so too
    assert model()["PrimaryContainer"]["Environment"]["LLAMA_ARG_CACHE_RAM"] == "0"


def test_make_run_turns_it_off_too():
    assert "-cram" in LLAMA_FLAGS and LLAMA_FLAGS[LLAMA_FLAGS.index("-cram") + 1] == "0"


def test_the_templates_gpu_condition_is_deploy_pys():
    assert {t for t in INSTANCE_TYPES if deploy.is_gpu(t)} >= {"ml.g5.xlarge", "ml.g6.xlarge"}
    for instance in INSTANCE_TYPES:
        params = {"InstanceType": instance}
        assert condition({"Condition": "Gpu"}, params) == deploy.is_gpu(instance), instance


@pytest.mark.parametrize("shell", [{"LLAMA_ARG_UBATCH": "32"}, {"LLAMA_ARG_UBATCH": ""}])
def test_one_compose_variable_sets_both(shell: dict[str, str]):
    expected = shell["LLAMA_ARG_UBATCH"] or str(UBATCH)
    llama, proxy = compose(False, shell)
    assert (llama["LLAMA_ARG_UBATCH"], proxy["PROXY_UPSTREAM_UBATCH"]) == (expected, expected)


@pytest.mark.parametrize("instance", [CPU, GPU])
def test_the_dlcs_variables_spell_flags_llama_server_has(instance: str):
    _, llama = deploy.model_request(config("dlc", instance))["Containers"]
    flags = dlc_flags(llama["Environment"])
    assert set(flags) <= set(LLAMA_SERVER_FLAGS)
    assert {"--parallel", "--ctx-size", "--ubatch-size", "--cache-ram"} <= set(flags)
    assert flags["--cache-ram"] == "0"


@pytest.mark.skipif(not os.environ.get("LLAMA_SERVER"), reason="LLAMA_SERVER names no binary")
def test_llama_server_has_those_flags_and_variables():
    binary = Path(os.environ["LLAMA_SERVER"])
    out = subprocess.run(
        [str(binary), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LD_LIBRARY_PATH": str(binary.parent)},
        check=False,
    )
    text = out.stdout + out.stderr
    for flag, variable in LLAMA_SERVER_FLAGS.items():
        assert re.search(rf"(^|[ ,]){re.escape(flag)}[ ,]", text, re.M), flag
        assert f"(env: {variable})" in text, variable


@pytest.mark.parametrize(
    ("environment", "pair"),
    [
        ({"LLAMA_ARG_UBATCH": "32"}, ("32", "32")),  # the proxy follows llama-server
        ({"LLAMA_ARG_UBATCH": "512", "PROXY_UPSTREAM_UBATCH": "0"}, ("512", "0")),  # GPU: unknown
        ({"PROXY_UPSTREAM_UBATCH": "0"}, (str(UBATCH), "0")),
        ({"LLAMA_ARG_UBATCH": "48", "PROXY_UPSTREAM_UBATCH": "48"}, ("48", "48")),
    ],
)
def test_the_single_image_tells_the_proxy_llama_servers_ubatch(environment, pair, tmp_path):
    llama, proxy = single_image(environment, tmp_path)
    assert (llama["LLAMA_ARG_UBATCH"], proxy["PROXY_UPSTREAM_UBATCH"]) == pair


@pytest.mark.parametrize(
    ("environment", "cache_ram"),
    [
        ({}, "0"),
        ({"LLAMA_ARG_CACHE_RAM": ""}, "0"),
        ({"LLAMA_ARG_CACHE_RAM": "0"}, "0"),
        ({"LLAMA_ARG_CACHE_RAM": "1024"}, "1024"),  # the operator's choice, warned about
        ({"LLAMA_ARG_CACHE_RAM": "-1"}, "-1"),  # no limit
    ],
)
def test_the_single_image_turns_the_prompt_cache_off_unless_told(environment, cache_ram, tmp_path):
    llama, _ = single_image(environment, tmp_path)
    assert llama["LLAMA_ARG_CACHE_RAM"] == cache_ram


@pytest.mark.parametrize(
    "environment",
    [
        {"LLAMA_ARG_UBATCH": "512", "PROXY_UPSTREAM_UBATCH": "63"},
        {"PROXY_UPSTREAM_UBATCH": "32"},  # llama-server would run with 63
        {"LLAMA_ARG_UBATCH": "sixty"},
        {"LLAMA_ARG_UBATCH": "0"},
        {"LLAMA_ARG_CACHE_RAM": "off"},  # not a size
        {"LLAMA_ARG_CACHE_RAM": "-2"},
        {"LLAMA_ARG_CACHE_RAM": "0 --cache-ram 8192"},
    ],
)
def test_the_single_image_refuses_a_proxy_told_another_ubatch(environment, tmp_path):
    code, argv, _ = run(
        SINGLE, ["serve"], {"SUPERVISORD": str(tmp_path / "fake"), **environment}, tmp_path
    )
    assert code == 64 and argv is None
