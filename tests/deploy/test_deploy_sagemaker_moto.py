"""deploy.py create, delete and transform against moto's SageMaker and Application Auto
Scaling: the three layouts of the model (single image, two containers, the proxy beside
AWS's llama.cpp container), scaling on concurrency, and the Batch Transform job."""

from __future__ import annotations

import json
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
    "--target-concurrency",
    "3",
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
        self.create_endpoint_config: list[dict[str, Any]] = []

    def __call__(self, service: str) -> Any:
        if service not in self.cache:
            client = self.session.client(service)
            client.meta.events.register(
                "provide-client-params.sagemaker.CreateModel",
                lambda params, **_: self.create_model.append(params),
            )
            client.meta.events.register(
                "provide-client-params.sagemaker.CreateEndpointConfig",
                lambda params, **_: self.create_endpoint_config.append(params),
            )
            self.cache[service] = client
        return self.cache[service]


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clients]:
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    with mock_aws():
        made = Clients()
        made("s3").create_bucket(Bucket="bucket")  # the model data's
        yield made


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
    # work in the container, not invocations, whose cost varies a hundredfold
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == (
        "SageMakerVariantConcurrentRequestsPerModelHighResolution"
    )
    assert tracking["TargetValue"] == 3.0


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


def with_images(*images: str) -> list[str]:
    """CREATE with its two images replaced by ``images``."""
    argv = list(CREATE)
    for flag in ("--proxy-image", "--llama-image"):
        i = argv.index(flag)
        del argv[i : i + 2]
    return argv + list(images)


SINGLE_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-single:0.1.0"
PROXY_IMAGE = CREATE[CREATE.index("--proxy-image") + 1]


def test_the_single_image_is_one_container_that_callers_need_not_name(clients: Clients, capsys):
    assert deploy.main(with_images("--image", SINGLE_IMAGE), clients=clients) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["layout"], printed["target_container_hostname"]) == ("single", None)
    sent = clients.create_model[-1]
    assert "Containers" not in sent and "InferenceExecutionConfig" not in sent
    container = clients("sagemaker").describe_model(ModelName=f"{NAME}-model")["PrimaryContainer"]
    assert container["Image"] == SINGLE_IMAGE
    assert container["ModelDataUrl"] == "s3://bucket/semif/model.tar.gz"
    # ml.g4dn is a GPU type: every layer offloaded, on an AMI with a pinned driver, llama-server's
    # -ub at its default 512 and the proxy told 0 (unknown); no host-memory prompt cache
    assert container["Environment"] == {
        "LLAMA_ARG_N_PARALLEL": "4",
        "LLAMA_ARG_CTX_SIZE": "32768",
        "LLAMA_ARG_N_GPU_LAYERS": "999",
        "LLAMA_ARG_UBATCH": "512",
        "LLAMA_ARG_CACHE_RAM": "0",
        "PROXY_UPSTREAM_UBATCH": "0",
    }
    variant = clients.create_endpoint_config[-1]["ProductionVariants"][0]
    assert variant["InferenceAmiVersion"] == deploy.GPU_AMI


@pytest.mark.parametrize(
    ("instance", "image"),
    [("ml.c5.xlarge", deploy.DLC_IMAGES["cpu"]), ("ml.g4dn.xlarge", deploy.DLC_IMAGES["gpu"])],
)
def test_the_llama_cpp_dlc_runs_unchanged_beside_the_proxy(clients: Clients, instance, image):
    argv = with_images("--proxy-image", PROXY_IMAGE, "--llama-dlc")
    argv[argv.index("--instance-type") + 1] = instance
    assert deploy.main(argv, clients=clients) == 0
    proxy, llama = clients("sagemaker").describe_model(ModelName=f"{NAME}-model")["Containers"]
    assert clients.create_model[-1]["InferenceExecutionConfig"] == {"Mode": "Direct"}
    assert llama["Image"] == image and llama["ModelDataUrl"] == "s3://bucket/semif/model.tar.gz"
    env = llama["Environment"]
    # the DLC's nginx on its own port: not the proxy's 8080, not the DLC's llama-server's 8081
    assert env["SM_LLAMA_CPP_PORT"] == "8082"
    assert proxy["Environment"]["UPSTREAM_URL"] == "http://127.0.0.1:8082"
    # SM_LLAMA_CPP_FOO_BAR=v becomes --foo-bar v: llama-server's long flags (-np is --parallel)
    assert (env["SM_LLAMA_CPP_PARALLEL"], env["SM_LLAMA_CPP_CTX_SIZE"]) == ("4", "32768")
    assert not any(key.startswith("LLAMA_ARG_") for key in env)  # the DLC reads SM_LLAMA_CPP_*
    gpu = instance.startswith("ml.g")
    assert ("SM_LLAMA_CPP_N_GPU_LAYERS" in env) == gpu
    # --ubatch-size 63 on CPU, told to the proxy; on GPU 512 and the proxy told 0 (unknown)
    assert (env["SM_LLAMA_CPP_UBATCH_SIZE"], proxy["Environment"]["PROXY_UPSTREAM_UBATCH"]) == (
        ("512", "0") if gpu else ("63", "63")
    )
    assert env["SM_LLAMA_CPP_CACHE_RAM"] == "0"  # --cache-ram 0, CPU and GPU
    variant = clients.create_endpoint_config[-1]["ProductionVariants"][0]
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] >= 600  # the DLC's docs
    assert ("InferenceAmiVersion" in variant) == gpu


@pytest.mark.parametrize(
    "images",
    [
        ("--image", SINGLE_IMAGE, "--proxy-image", PROXY_IMAGE),
        ("--proxy-image", PROXY_IMAGE),
        ("--proxy-image", PROXY_IMAGE, "--llama-image", "x", "--llama-dlc"),
        (),
    ],
)
def test_images_that_name_no_layout_create_nothing(clients: Clients, images, capsys):
    assert deploy.main(with_images(*images), clients=clients) == 2
    assert "--image" in capsys.readouterr().err
    assert clients("sagemaker").list_models()["Models"] == []


TRANSFORM = [
    "transform",
    "--name",
    "nightly-1",
    "--region",
    "us-east-1",
    "--input",
    "s3://bucket/tickets/",
    "--output",
    "s3://bucket/answers/",
    "--instance-type",
    "ml.m5.xlarge",
    "--invocations-timeout",
    "1800",
]


def test_transform_makes_the_single_image_model_and_a_line_by_line_job(clients: Clients, capsys):
    argv = TRANSFORM + [
        "--image",
        SINGLE_IMAGE,
        "--model-data",
        "s3://bucket/semif/model.tar.gz",
        "--role",
        ROLE,
    ]
    assert deploy.main(argv, clients=clients) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "nightly-1-model"
    sm = clients("sagemaker")
    assert sm.describe_model(ModelName="nightly-1-model")["PrimaryContainer"]["Image"] == (
        SINGLE_IMAGE
    )
    job = sm.describe_transform_job(TransformJobName="nightly-1")
    assert job["ModelName"] == "nightly-1-model"
    assert (job["BatchStrategy"], job["MaxConcurrentTransforms"], job["MaxPayloadInMB"]) == (
        "MultiRecord",
        1,
        1,
    )
    assert job["TransformInput"]["SplitType"] == "Line"
    assert job["TransformInput"]["ContentType"] == "application/jsonlines"
    assert job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"] == "s3://bucket/tickets/"
    assert job["TransformOutput"] == {
        "S3OutputPath": "s3://bucket/answers/",
        "Accept": "application/jsonlines",
        "AssembleWith": "Line",
    }
    # the proxy is told the job's payload timeout and payload size, and each line's
    # decision deadline (and its llama-server calls') is the job's timeout
    assert job["ModelClientConfig"]["InvocationsTimeoutInSeconds"] == 1800
    assert job["Environment"] == {
        "PROXY_INVOCATIONS_TIMEOUT": "1800",
        "PROXY_DEADLINE": "1800",
        "PROXY_MAX_DEADLINE": "1800",
        "PROXY_REQUEST_TIMEOUT": "1800",
        "PROXY_MAX_BODY_BYTES": str(1024 * 1024),
    }
    assert job["TransformResources"] == {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1}


def test_transform_environment_names_settings_the_proxy_reads():
    from proxy.config import load_settings

    request = deploy.transform_request(
        deploy.TransformConfig(
            name="j",
            input="s3://b/i/",
            output="s3://b/o/",
            model="m",
            invocations_timeout_s=900,
            max_payload_mb=20,
        )
    )
    settings = load_settings([], request["Environment"])
    assert settings.invocations_timeout_s == 900.0
    assert settings.decision_deadline_s == settings.max_decision_deadline_s == 900.0
    assert settings.request_timeout_s == 900.0
    assert settings.max_body_bytes == 20 * 1024 * 1024


def test_transform_on_an_existing_model_creates_no_model(clients: Clients):
    assert deploy.main(TRANSFORM + ["--model", "semif-model"], clients=clients) == 0
    sm = clients("sagemaker")
    assert sm.list_models()["Models"] == []
    assert sm.describe_transform_job(TransformJobName="nightly-1")["ModelName"] == "semif-model"


@pytest.mark.parametrize(
    "extra",
    [
        [],  # neither --model nor --image
        ["--model", "m", "--image", SINGLE_IMAGE],
        ["--image", SINGLE_IMAGE],  # without --model-data and --role
        ["--model", "m", "--invocations-timeout", "3601"],
        ["--model", "m", "--max-payload-mb", "101"],
    ],
)
def test_bad_transform_arguments_start_nothing(clients: Clients, extra, capsys):
    argv = [a for a in TRANSFORM if a not in ("--invocations-timeout", "1800")] + extra
    assert deploy.main(argv, clients=clients) == 2
    assert "deploy:" in capsys.readouterr().err
    assert clients("sagemaker").list_transform_jobs()["TransformJobSummaries"] == []


CAPTURE = "s3://captures/semif/"  # not the model data's bucket, where the key goes


def test_capture_keeps_the_answers_only_as_json_and_the_answers_carry_records(clients: Clients):
    argv = with_images("--image", SINGLE_IMAGE) + ["--capture", CAPTURE, "--capture-percent", "20"]
    assert deploy.main(argv, clients=clients) == 0
    expected = {
        "EnableCapture": True,
        "InitialSamplingPercentage": 20,
        "DestinationS3Uri": CAPTURE,
        # Data Capture records the requests too unless told not to: the answers only
        "CaptureOptions": [{"CaptureMode": "Output"}],
        # declared JSON types are stored as JSON text, the others base64
        "CaptureContentTypeHeader": {
            "JsonContentTypes": ["application/json", "application/jsonlines"]
        },
    }
    assert clients.create_endpoint_config[-1]["DataCaptureConfig"] == expected
    sm = clients("sagemaker")
    described = sm.describe_endpoint_config(EndpointConfigName=f"{NAME}-config")
    assert described.get("DataCaptureConfig", expected) == expected  # where moto echoes it
    env = sm.describe_model(ModelName=f"{NAME}-model")["PrimaryContainer"]["Environment"]
    assert env["PROXY_DECISION_RECORDS"] == "answer"


def test_capture_inputs_only_when_asked_and_records_reach_the_proxy_container(clients: Clients):
    argv = CREATE + ["--capture", CAPTURE, "--capture-inputs"]
    assert deploy.main(argv, clients=clients) == 0
    capture = clients.create_endpoint_config[-1]["DataCaptureConfig"]
    assert capture["CaptureOptions"] == [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]
    assert capture["InitialSamplingPercentage"] == 100
    proxy, llama = clients("sagemaker").describe_model(ModelName=f"{NAME}-model")["Containers"]
    assert proxy["Environment"]["PROXY_DECISION_RECORDS"] == "answer"
    assert "PROXY_DECISION_RECORDS" not in llama["Environment"]


def test_without_capture_nothing_is_captured_and_answers_stay_plain(clients: Clients):
    assert deploy.main(with_images("--image", SINGLE_IMAGE), clients=clients) == 0
    assert "DataCaptureConfig" not in clients.create_endpoint_config[-1]
    env = clients.create_model[-1]["PrimaryContainer"]["Environment"]
    assert "PROXY_DECISION_RECORDS" not in env


@pytest.mark.parametrize(
    "extra",
    [
        ["--capture", "https://bucket/capture/"],
        ["--capture", CAPTURE, "--capture-percent", "0"],
        ["--capture", CAPTURE, "--capture-percent", "101"],
        ["--capture-inputs"],  # without --capture
    ],
)
def test_bad_capture_arguments_create_nothing(clients: Clients, extra, capsys):
    assert deploy.main(CREATE + extra, clients=clients) == 2
    assert "--capture" in capsys.readouterr().err
    assert clients("sagemaker").list_models()["Models"] == []


def test_the_capture_environment_names_the_setting_the_proxy_reads():
    from proxy.config import load_settings

    cfg = deploy.DeployConfig(
        name="s", image="i", model_data="s3://b/m", role="arn:r", capture_s3_uri=CAPTURE
    )
    settings = load_settings([], deploy.proxy_environment(cfg))
    assert settings.decision_records == "answer"


KEY = "semif/semif-test-records-key/records.key"  # beside the model data, by default


def test_capture_keys_the_prompt_hashes_by_one_key_kept_across_deployments(clients: Clients):
    argv = CREATE + ["--capture", CAPTURE]
    assert deploy.main(argv, clients=clients) == 0
    s3 = clients("s3")
    key = s3.get_object(Bucket="bucket", Key=KEY)["Body"].read()
    assert len(bytes.fromhex(key.decode())) == 32
    proxy, llama = clients.create_model[-1]["Containers"]
    assert proxy["AdditionalModelDataSources"] == [
        {
            "ChannelName": "records-key",
            "S3DataSource": {
                "S3Uri": "s3://bucket/semif/semif-test-records-key/",
                "S3DataType": "S3Prefix",
                "CompressionType": "None",
            },
        }
    ]
    assert proxy["Environment"]["PROXY_DECISION_RECORDS_KEY_FILE"] == (
        "/opt/ml/additional-model-data-sources/records-key/records.key"
    )
    assert "AdditionalModelDataSources" not in llama
    # the key's value is in no container's environment (DescribeModel shows them)
    shown = json.dumps(clients.create_model[-1])
    assert key.decode() not in shown
    # deleted and created again (a redeployment): the same key, so hashes still compare
    deploy.main(["delete", "--name", NAME, "--region", "us-east-1", "--no-wait"], clients=clients)
    assert deploy.main(argv, clients=clients) == 0
    assert s3.get_object(Bucket="bucket", Key=KEY)["Body"].read() == key


def test_a_records_key_given_is_taken_as_it_is(clients: Clients, capsys):
    s3 = clients("s3")
    s3.create_bucket(Bucket="secrets")
    s3.put_object(Bucket="secrets", Key="semif/records.key", Body=b"an operator's own key 1234")
    argv = CREATE + ["--capture", CAPTURE, "--records-key", "s3://secrets/semif/"]
    assert deploy.main(argv, clients=clients) == 0
    kept = s3.get_object(Bucket="secrets", Key="semif/records.key")["Body"].read()
    assert kept == b"an operator's own key 1234"
    proxy = clients.create_model[-1]["Containers"][0]
    assert proxy["AdditionalModelDataSources"][0]["S3DataSource"]["S3Uri"] == (
        "s3://secrets/semif/"
    )
    assert json.loads(capsys.readouterr().out)["records_key"] == "s3://secrets/semif/records.key"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--records-key", "s3://secrets/semif/"], "--records-key needs --capture"),
        (["--capture", CAPTURE, "--records-key", "s3://secrets/k"], "ending in /"),
        (["--capture", CAPTURE, "--records-key", "s3://captures/key/"], "capture bucket"),
        # by default the key goes beside the model data: not when that is the capture bucket
        (["--capture", "s3://bucket/semif/capture/"], "capture bucket"),
    ],
)
def test_a_records_key_beside_the_captures_or_without_them_is_refused(
    clients: Clients, extra, says, capsys
):
    assert deploy.main(CREATE + extra, clients=clients) == 2
    assert says in capsys.readouterr().err
    assert clients("sagemaker").list_models()["Models"] == []
    assert clients("s3").list_objects_v2(Bucket="bucket").get("KeyCount", 0) == 0
