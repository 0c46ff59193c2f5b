"""deploy.py create and delete against moto's SageMaker and Application Auto Scaling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from deploy import deploy

NAME = "semif-test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"
CREATE = [
    "create",
    "--name",
    NAME,
    "--region",
    "us-east-1",
    "--proxy-image",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-proxy:0.1.0",
    "--llama-image",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-llama:b11434",
    "--model-data",
    "s3://bucket/semif/model.tar.gz",
    "--role",
    ROLE,
    # moto knows fewer instance types than SageMaker; this one is in both
    "--instance-type",
    "ml.g4dn.xlarge",
    "--min-instances",
    "1",
    "--max-instances",
    "3",
    "--target-invocations",
    "30",
]
RESOURCE_ID = f"endpoint/{NAME}/variant/AllTraffic"


class Clients:
    """``clients`` for deploy.py: one mocked client per service, CreateModel requests kept."""

    def __init__(self) -> None:
        self.session = boto3.Session(
            region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
        )
        self.cache: dict[str, Any] = {}
        self.create_model: list[dict[str, Any]] = []

    def __call__(self, service: str) -> Any:
        if service not in self.cache:
            client = self.session.client(service)
            client.meta.events.register(
                "provide-client-params.sagemaker.CreateModel",
                lambda params, **_: self.create_model.append(params),
            )
            self.cache[service] = client
        return self.cache[service]


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clients]:
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    with mock_aws():
        yield Clients()


def test_create_builds_two_containers_an_endpoint_and_scaling(clients: Clients):
    assert deploy.main(CREATE, clients=clients) == 0
    sm, aas = clients("sagemaker"), clients("application-autoscaling")

    model = sm.describe_model(ModelName=f"{NAME}-model")
    assert [c["ContainerHostname"] for c in model["Containers"]] == ["proxy", "llama"]
    proxy, llama = model["Containers"]
    assert proxy["Environment"]["UPSTREAM_URL"] == "http://127.0.0.1:8081"
    assert llama["ModelDataUrl"] == "s3://bucket/semif/model.tar.gz"
    assert model["ExecutionRoleArn"] == ROLE
    # moto does not echo InferenceExecutionConfig; check what was sent
    assert clients.create_model[-1]["InferenceExecutionConfig"] == {"Mode": "Direct"}

    endpoint = sm.describe_endpoint(EndpointName=NAME)
    assert endpoint["EndpointConfigName"] == f"{NAME}-config"
    variant = sm.describe_endpoint_config(EndpointConfigName=f"{NAME}-config")[
        "ProductionVariants"
    ][0]
    assert (variant["ModelName"], variant["InstanceType"], variant["InitialInstanceCount"]) == (
        f"{NAME}-model",
        "ml.g4dn.xlarge",
        1,
    )

    target = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert [(t["ResourceId"], t["MinCapacity"], t["MaxCapacity"]) for t in target] == [
        (RESOURCE_ID, 1, 3)
    ]
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    assert len(policies) == 1
    tracking = policies[0]["TargetTrackingScalingPolicyConfiguration"]
    assert policies[0]["ResourceId"] == RESOURCE_ID
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == (
        "SageMakerVariantInvocationsPerInstance"
    )
    assert tracking["TargetValue"] == 30.0


def test_delete_removes_everything_and_can_run_twice(clients: Clients):
    assert deploy.main(CREATE, clients=clients) == 0
    delete = ["delete", "--name", NAME, "--region", "us-east-1"]
    assert deploy.main(delete, clients=clients) == 0
    sm, aas = clients("sagemaker"), clients("application-autoscaling")
    assert sm.list_models()["Models"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert sm.list_endpoints()["Endpoints"] == []
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert deploy.main(delete, clients=clients) == 0


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--model-data", "https://bucket/model.tar.gz"),
        ("--role", "SageMakerExecution"),
        ("--min-instances", "4"),  # above --max-instances 3
        ("--name", "bad_name"),
    ],
)
def test_bad_arguments_create_nothing(clients: Clients, flag: str, value: str, capsys):
    argv = list(CREATE)
    argv[argv.index(flag) + 1] = value
    assert deploy.main(argv, clients=clients) == 2
    assert "deploy:" in capsys.readouterr().err
    assert clients("sagemaker").list_models()["Models"] == []
