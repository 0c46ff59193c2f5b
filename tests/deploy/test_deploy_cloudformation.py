"""deploy/sagemaker.yaml: cfn-lint finds nothing, and it describes the same deployment
as deploy/deploy.py (containers, their environment, variant, scaling), in both layouts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint
from cfnlint.decode.cfn_yaml import loads

from deploy import deploy

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "deploy" / "sagemaker.yaml").read_text()
TEMPLATE = loads(TEXT)
RESOURCES = TEMPLATE["Resources"]
CONFIG = deploy.DeployConfig(
    name="semif",
    proxy_image="p",
    llama_image="l",
    model_data="s3://b/m.tar.gz",
    role="arn:aws:iam::123456789012:role/r",
)
SINGLE = deploy.DeployConfig(
    name="semif", image="s", model_data="s3://b/m.tar.gz", role="arn:aws:iam::123456789012:role/r"
)


NO_CAPTURE = {"Gpu": False, "Capture": False, "CaptureRequests": False}


def branch(prop: dict, single: bool):
    """One side of a property's ``!If [Single, ...]``; None where it is AWS::NoValue."""
    value = prop["Fn::If"][1 if single else 2]
    return None if value == {"Ref": "AWS::NoValue"} else value


def findings(text: str) -> list[str]:
    return [
        f"{m.rule.id} line {m.linenumber}: {m.message}"
        for m in lint(text, config=ManualArgs(regions=["us-east-1", "eu-west-1"]))
    ]


def test_cfn_lint_is_clean():
    assert findings(TEXT) == []


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ("Mode: Direct", "Mode: Parallel", "E3030"),
        (
            "PredefinedMetricType: SageMakerVariantConcurrentRequestsPerModelHighResolution",
            "PredefinedMetricType: ConcurrentRequestsPerModel",
            "E3030",
        ),
        ("ModelDataUrl: !Ref ModelDataUrl", "ModelDataUrl: !Ref ModelData", "E1020"),
    ],
)
def test_cfn_lint_catches_broken_variants(old: str, new: str, rule: str):
    assert old in TEXT
    assert any(f.startswith(rule) for f in findings(TEXT.replace(old, new)))


def test_model_is_one_container_or_the_proxy_and_llama_in_direct_mode():
    model = RESOURCES["Model"]["Properties"]
    assert TEMPLATE["Parameters"]["Layout"]["Default"] == "single"
    assert branch(model["PrimaryContainer"], True)["Image"] == {"Ref": "SingleImageUri"}
    assert branch(model["Containers"], True) is None
    assert branch(model["InferenceExecutionConfig"], True) is None
    assert branch(model["PrimaryContainer"], False) is None
    assert branch(model["InferenceExecutionConfig"], False)["Mode"] == "Direct"
    two = branch(model["Containers"], False)
    assert [c["ContainerHostname"] for c in two] == ["proxy", "llama"]
    assert "ModelDataUrl" in two[1]


def test_template_and_deploy_py_agree_on_the_single_image():
    ours = deploy.model_request(SINGLE)["PrimaryContainer"]
    theirs = branch(RESOURCES["Model"]["Properties"]["PrimaryContainer"], True)
    assert set(ours["Environment"]) == set(when(theirs["Environment"], NO_CAPTURE))
    assert ("ModelDataUrl" in ours) and ("ModelDataUrl" in theirs)
    assert "Containers" not in deploy.model_request(SINGLE)


def test_template_and_deploy_py_agree_on_containers():
    ours = deploy.model_request(CONFIG)
    template = RESOURCES["Model"]["Properties"]
    assert ours["InferenceExecutionConfig"] == branch(template["InferenceExecutionConfig"], False)
    containers = branch(template["Containers"], False)
    for mine, theirs in zip(ours["Containers"], containers, strict=True):
        assert mine["ContainerHostname"] == theirs["ContainerHostname"]
        assert set(mine["Environment"]) == set(when(theirs["Environment"], NO_CAPTURE))
        assert ("ModelDataUrl" in mine) == ("ModelDataUrl" in theirs)
    assert ours["Containers"][0]["Environment"]["PROXY_HOST"] == "0.0.0.0"
    assert containers[0]["Environment"]["PROXY_HOST"] == "0.0.0.0"


def test_template_and_deploy_py_agree_on_scaling():
    ours = deploy.scaling_policy_request(CONFIG)["TargetTrackingScalingPolicyConfiguration"]
    template = RESOURCES["ConcurrencyScalingPolicy"]["Properties"]
    theirs = template["TargetTrackingScalingPolicyConfiguration"]
    assert template["PolicyType"] == "TargetTrackingScaling"
    assert theirs["PredefinedMetricSpecification"] == ours["PredefinedMetricSpecification"]
    assert (theirs["ScaleInCooldown"], theirs["ScaleOutCooldown"]) == (
        ours["ScaleInCooldown"],
        ours["ScaleOutCooldown"],
    )
    target = RESOURCES["ScalableTarget"]["Properties"]
    assert target["ScalableDimension"] == deploy.SCALABLE_DIMENSION
    variant = RESOURCES["EndpointConfig"]["Properties"]["ProductionVariants"][0]
    assert variant["VariantName"] == deploy.VARIANT
    resource_id = f"endpoint/${{Endpoint.EndpointName}}/variant/{deploy.VARIANT}"
    assert target["ResourceId"] == {"Fn::Sub": resource_id}


def test_instance_types_default_to_cpu_and_allow_gpus():
    instance = TEMPLATE["Parameters"]["InstanceType"]
    assert instance["Default"] == deploy.DEFAULT_INSTANCE_TYPE == "ml.c7i.xlarge"
    assert {"ml.g5.xlarge", "ml.g6.xlarge"} <= set(instance["AllowedValues"])


CAPTURE = deploy.DeployConfig(
    name="semif",
    image="s",
    model_data="s3://b/m.tar.gz",
    role="arn:aws:iam::123456789012:role/r",
    capture_s3_uri="s3://captures/semif/",
)


def when(value, conditions: dict[str, bool]):
    """``value`` with every ``Fn::If`` resolved under ``conditions``; None for AWS::NoValue
    (dropped from maps and lists, as CloudFormation drops it)."""
    if isinstance(value, dict):
        if set(value) == {"Fn::If"}:
            name, yes, no = value["Fn::If"]
            return when(yes if conditions[name] else no, conditions)
        if value == {"Ref": "AWS::NoValue"}:
            return None
        resolved = {k: when(v, conditions) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not None}
    if isinstance(value, list):
        return [v for v in (when(item, conditions) for item in value) if v is not None]
    return value


@pytest.mark.parametrize("inputs", [False, True])
def test_template_and_deploy_py_agree_on_data_capture(inputs: bool):
    variant = RESOURCES["EndpointConfig"]["Properties"]
    on = {"Capture": True, "CaptureRequests": inputs}
    theirs = when(variant["DataCaptureConfig"], on)
    ours = deploy.data_capture_config(dataclasses.replace(CAPTURE, capture_inputs=inputs))
    assert ours is not None
    assert theirs["CaptureOptions"] == ours["CaptureOptions"]
    assert theirs["CaptureContentTypeHeader"] == ours["CaptureContentTypeHeader"]
    assert theirs["EnableCapture"] is ours["EnableCapture"] is True
    assert theirs["DestinationS3Uri"] == {"Ref": "CaptureS3Uri"}
    assert theirs["InitialSamplingPercentage"] == {"Ref": "CapturePercent"}
    assert when(variant, {"Capture": False, "CaptureRequests": False}).get("DataCaptureConfig") is (
        None
    )


def test_capture_is_off_by_default_and_outputs_only_unless_asked():
    params = TEMPLATE["Parameters"]
    assert params["CaptureS3Uri"]["Default"] == ""
    assert params["CaptureInputs"]["Default"] == "false"
    assert (params["CapturePercent"]["MinValue"], params["CapturePercent"]["MaxValue"]) == (1, 100)


@pytest.mark.parametrize("capture", [False, True])
def test_template_and_deploy_py_agree_on_the_proxy_environment_with_capture(capture: bool):
    conditions = {"Single": True, "Gpu": False, "Capture": capture, "CaptureRequests": False}
    model = when(RESOURCES["Model"]["Properties"], conditions)
    cfg = CAPTURE if capture else SINGLE
    ours = deploy.model_request(cfg)["PrimaryContainer"]["Environment"]
    assert model["PrimaryContainer"]["Environment"].keys() == ours.keys() - {
        "PROXY_DECISION_RECORDS_KEY_FILE"
    }
    assert (
        ours.get("PROXY_DECISION_RECORDS")
        == model["PrimaryContainer"]["Environment"].get("PROXY_DECISION_RECORDS")
        == ("answer" if capture else None)
    )
    # one difference: deploy.py mounts the deployment's prompt-hash key and names its file;
    # CloudFormation's AWS::SageMaker::Model has no AdditionalModelDataSources to mount it
    assert ("PROXY_DECISION_RECORDS_KEY_FILE" in ours) is capture
    assert "AdditionalModelDataSources" not in model["PrimaryContainer"]
    two = when(RESOURCES["Model"]["Properties"], {**conditions, "Single": False})
    assert ("PROXY_DECISION_RECORDS" in two["Containers"][0]["Environment"]) is capture
    assert "PROXY_DECISION_RECORDS" not in two["Containers"][1]["Environment"]


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ("- CaptureMode: Output", "- CaptureMode: Outputs", "E3030"),
        ("InitialSamplingPercentage: !Ref", "InitialSamplingPercent: !Ref", "E3003"),
    ],
)
def test_cfn_lint_catches_broken_capture(old: str, new: str, rule: str):
    assert old in TEXT
    assert any(f.startswith(rule) for f in findings(TEXT.replace(old, new)))
