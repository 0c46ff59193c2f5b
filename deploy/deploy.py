"""Create or delete the sidecar's SageMaker real-time endpoint, or run a Batch Transform
job, with boto3.

    python -m deploy create --name semif --image URI --model-data s3://bucket/model.tar.gz \\
        --role arn:aws:iam::123456789012:role/x [--instance-type ml.c7i.xlarge] \\
        [--min-instances 1] [--max-instances 2] [--target-concurrency 3] [--no-wait]
    python -m deploy create ... --proxy-image URI --llama-image URI     (two containers)
    python -m deploy create ... --proxy-image URI --llama-dlc [--dlc-image URI]
    python -m deploy create ... --capture s3://bucket/capture/ [--capture-percent 100] \\
        [--capture-inputs]                                   (Data Capture of decision records)
    python -m deploy delete --name semif [--region eu-west-1]
    python -m deploy transform --name job-1 --image URI --model-data s3://... --role ARN \\
        --input s3://bucket/in/ --output s3://bucket/out/ [--invocations-timeout 3600]

Three layouts of the real-time model (docs/sagemaker.md says which to use when):

- ``single`` (``--image``, recommended): one container from Dockerfile.single holding
  llama-server and the proxy; callers need no ``TargetContainerHostname``.
- ``two`` (``--proxy-image`` and ``--llama-image``): Dockerfile.proxy and Dockerfile.llama as
  two containers in ``Direct`` mode; callers name ``proxy``.
- ``dlc`` (``--proxy-image`` and ``--llama-dlc``): the proxy beside AWS's llama.cpp Deep
  Learning Container, unchanged, its nginx moved to port 8082 (``SM_LLAMA_CPP_PORT``) so it
  does not collide with the proxy's 8080 or its own llama-server's 8081.

In every layout llama-server's physical batch (``-ub``) is 63 on CPU instance types and the
proxy is told so (``PROXY_UPSTREAM_UBATCH``): new conversations are then read in one request,
bit for bit repeatable (docs/repeatability.md). GPU types keep llama-server's 512 and tell the
proxy 0 (unknown). On every instance type llama-server's host-memory prompt cache is off
(``--cache-ram 0``): it would move saved states between slots under the proxy's reads.

The endpoint scales on SageMaker's high-resolution ``ConcurrentRequestsPerModel`` (requests
in flight or queued in the container), which follows work, not on invocations, whose cost
varies a hundredfold with options and questions.

``--capture`` turns on SageMaker Data Capture for the endpoint: SageMaker writes a sampled
share of the invocations (``--capture-percent``) to S3 as JSON lines, and the proxy is told to
put each decision's record in its answer (``PROXY_DECISION_RECORDS=answer``), so a captured
answer carries its record (``python -m semif_tools records-from-capture`` reads them back).
Only the answers are captured unless ``--capture-inputs`` asks for the requests too, which hold
the conversations; the JSON content types are declared, so captures hold JSON, not base64.

With ``--capture`` the prompt hashes in the records (``prompt_hash``, an HMAC of the prompt's
tokens) are keyed by one key for the whole deployment, so that they compare across its
instances, restarts and redeployments: ``records.key`` under ``--records-key`` (an s3:// prefix
of its own; default ``<name>-records-key/`` beside the model data), created with 32 random
bytes when missing and kept when present. SageMaker copies it into the proxy's container as an
additional model data source (``/opt/ml/additional-model-data-sources/records-key/``) and
the proxy is told the file's path, never the key: an environment variable's value shows in
DescribeModel. It may not sit in the capture bucket, beside the hashes it keys.

``transform`` runs a job on the single image (an existing model with ``--model``, or one it
creates from ``--image``): JSON lines in, one answer per line out, in order, each payload
bounded by ``--invocations-timeout``, which the proxy is told too (PROXY_INVOCATIONS_TIMEOUT),
and each line's decision deadline with it (PROXY_DEADLINE, PROXY_MAX_DEADLINE and the
per-call PROXY_REQUEST_TIMEOUT: Batch Transform sends no header of the caller's).

Names derive from ``--name``: model ``<name>-model``, endpoint config ``<name>-config``,
endpoint ``<name>``. ``delete`` removes them in reverse order and treats what is already
gone as deleted. Functions take ``clients``: a callable returning a boto3 client for a
service name, such as ``boto3.Session(region_name=...).client``; tests hand in mocked ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DeployConfig",
    "Names",
    "TransformConfig",
    "create",
    "data_capture_config",
    "delete",
    "endpoint_config_request",
    "main",
    "model_request",
    "scaling_policy_request",
    "transform",
    "transform_request",
]

Clients = Callable[[str], Any]

VARIANT = "AllTraffic"
PROXY_HOSTNAME = "proxy"
LLAMA_HOSTNAME = "llama"
DEFAULT_INSTANCE_TYPE = "ml.c7i.xlarge"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
SCALING_METRIC = "SageMakerVariantConcurrentRequestsPerModelHighResolution"
# AWS's llama.cpp Deep Learning Containers (nginx in front of llama-server: /ping -> /health,
# /invocations -> /v1/chat/completions; docs/sagemaker.md); copy one into your own ECR
# and pass --dlc-image if SageMaker cannot pull from the public gallery in your setup
DLC_IMAGES = {
    "cpu": "public.ecr.aws/deep-learning-containers/llama-cpp:server-sagemaker-cpu-v1",
    "gpu": "public.ecr.aws/deep-learning-containers/llama-cpp:server-sagemaker-cuda-v1",
}
DLC_PORT = 8082  # the DLC's nginx: not the proxy's 8080, not the DLC's own llama-server's 8081
DLC_MIN_STARTUP_S = 600  # the DLC's docs ask for ContainerStartupHealthCheckTimeout >= 600
GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"  # a pinned driver for the CUDA images
GPU_LAYERS = "999"  # every layer on the GPU
# llama-server's physical batch (-ub), which the proxy is told (PROXY_UPSTREAM_UBATCH): 63 on
# CPU, where the proxy then reads new conversations in one request, bit for bit repeatable
# (docs/repeatability.md); on GPU llama-server's default 512 (large batches suit a GPU, and
# the argument is about the CPU kernels) and 0 (unknown) for the proxy
CPU_UBATCH = 63
GPU_UBATCH = 512
# --cache-ram 0, on CPU and GPU: with the host-memory prompt cache on (8 GiB by default)
# llama-server moves a saved state into another slot when a new prompt matches it better than
# that slot's content; the proxy, which tracks what each slot holds, then sees an unexpected
# reuse and reads again from position 0 (the prompt evaluated twice), and a restored state can
# end in a row evaluated alone, which a longer prompt must not build on
CACHE_RAM_MIB = 0
# llama-server's settings: LLAMA_ARG_<key> (the variable it reads itself, as our images
# pass it on) and SM_LLAMA_CPP_<value> for the DLC, which turns SM_LLAMA_CPP_FOO_BAR=v into
# --foo-bar v, so the value spells the long flag (-np is --parallel, -ub --ubatch-size)
_DLC_NAMES = {
    "N_PARALLEL": "PARALLEL",
    "CTX_SIZE": "CTX_SIZE",
    "UBATCH": "UBATCH_SIZE",
    "CACHE_RAM": "CACHE_RAM",
    "N_GPU_LAYERS": "N_GPU_LAYERS",
}
MIB = 1024 * 1024
# Data Capture: the answers' content types (one JSON object; the jsonlines /invocations body),
# declared so SageMaker stores them as JSON text, not base64 (it encodes undeclared ones)
CAPTURE_JSON_TYPES = ("application/json", "application/jsonlines")
CAPTURE_RECORDS = "answer"  # PROXY_DECISION_RECORDS: each answer carries its decisions' records
# The prompt hashes' key (docs/sagemaker.md): an object of its own that SageMaker copies into
# the proxy's container, whose path (not value) the proxy is told
RECORDS_KEY_OBJECT = "records.key"
RECORDS_KEY_CHANNEL = "records-key"  # AdditionalModelDataSources' ChannelName
RECORDS_KEY_FILE = (
    f"/opt/ml/additional-model-data-sources/{RECORDS_KEY_CHANNEL}/{RECORDS_KEY_OBJECT}"
)
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,55}$")  # leaves room for "-config"
_SUMMARY = "Create or delete the sidecar's SageMaker endpoint, or run a Batch Transform job."
_GONE = {"ObjectNotFoundException", "ResourceNotFound"}
_MISSING = re.compile(r"could not find|not found|no .* found|does not exist")


def is_gpu(instance_type: str) -> bool:
    return instance_type.startswith(("ml.g", "ml.p"))


@dataclass(frozen=True)
class DeployConfig:
    name: str
    model_data: str
    role: str
    image: str | None = None  # Dockerfile.single
    proxy_image: str | None = None  # Dockerfile.proxy
    llama_image: str | None = None  # Dockerfile.llama
    llama_dlc: bool = False  # AWS's llama.cpp container beside the proxy image
    dlc_image: str | None = None  # default: DLC_IMAGES for the instance type
    instance_type: str = DEFAULT_INSTANCE_TYPE
    min_instances: int = 1
    max_instances: int = 2
    target_concurrency: float = 3.0  # requests in flight or queued per instance
    upstream_url: str = "http://127.0.0.1:8081"  # two containers: where llama-server is
    parallel: int = 4
    ctx_size: int = 32768
    startup_timeout_s: int = 900  # model download + load before /ping must pass
    capture_s3_uri: str | None = None  # Data Capture's destination; None: no capture
    capture_percent: int = 100  # invocations captured (InitialSamplingPercentage)
    capture_inputs: bool = False  # capture the requests too (they hold the conversations)
    records_key: str | None = None  # s3:// prefix of records.key; None: beside the model data

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: letters, digits and '-', at most 56 characters")
        if not self.model_data.startswith("s3://"):
            raise ValueError("model data must be an s3:// URL")
        if not self.role.startswith("arn:"):
            raise ValueError("role must be an IAM role ARN")
        if not 1 <= self.min_instances <= self.max_instances:
            raise ValueError("need 1 <= min instances <= max instances")
        if not self.target_concurrency > 0:
            raise ValueError("target concurrency must be positive")
        if self.capture_s3_uri is not None and not self.capture_s3_uri.startswith("s3://"):
            raise ValueError("--capture must be an s3:// URL")
        if not 1 <= self.capture_percent <= 100:
            raise ValueError("--capture-percent: 1 to 100")
        if self.capture_inputs and self.capture_s3_uri is None:
            raise ValueError("--capture-inputs needs --capture")
        if self.records_key is not None:
            if self.capture_s3_uri is None:
                raise ValueError("--records-key needs --capture (it keys the captured records)")
            if not (self.records_key.startswith("s3://") and self.records_key.endswith("/")):
                raise ValueError("--records-key must be an s3:// prefix ending in /")
        if self.capture_s3_uri is not None and _bucket(self.key_prefix) == _bucket(
            self.capture_s3_uri
        ):
            raise ValueError(
                f"the records key would sit in the capture bucket ({_bucket(self.capture_s3_uri)}),"
                " beside the hashes it keys: give --records-key s3://<another bucket>/<prefix>/"
            )
        self.layout  # noqa: B018 - raises for a mix of images that names no layout
        if self.layout == "dlc" and self.startup_timeout_s < DLC_MIN_STARTUP_S:
            raise ValueError(
                f"the llama.cpp DLC needs a startup timeout of at least {DLC_MIN_STARTUP_S} s"
            )

    @property
    def layout(self) -> str:
        """ "single", "two" or "dlc", from the images given."""
        if self.image and not (self.proxy_image or self.llama_image or self.llama_dlc):
            return "single"
        if self.proxy_image and self.llama_image and not (self.image or self.llama_dlc):
            return "two"
        if self.proxy_image and self.llama_dlc and not (self.image or self.llama_image):
            return "dlc"
        raise ValueError(
            "give --image (the single image), or --proxy-image with either "
            "--llama-image or --llama-dlc"
        )

    @property
    def gpu(self) -> bool:
        return is_gpu(self.instance_type)

    @property
    def key_prefix(self) -> str:
        """The s3:// prefix that holds ``records.key``: ``--records-key``, else
        ``<name>-records-key/`` in the model data's folder."""
        if self.records_key is not None:
            return self.records_key
        folder = self.model_data.rpartition("/")[0]
        return f"{folder}/{self.name}-records-key/"


def _split(uri: str) -> tuple[str, str]:
    """An s3:// URI's bucket and key."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _bucket(uri: str) -> str:
    return _split(uri)[0]


def ensure_records_key(cfg: DeployConfig, clients: Clients) -> None:
    """``records.key`` under ``cfg.key_prefix``: kept when it exists (so every instance,
    restart and redeployment hashes alike), else created with 32 random bytes (as 64 hex
    characters)."""
    bucket, prefix = _split(cfg.key_prefix)
    s3 = clients("s3")
    try:
        s3.head_object(Bucket=bucket, Key=prefix + RECORDS_KEY_OBJECT)
        return
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
    s3.put_object(
        Bucket=bucket,
        Key=prefix + RECORDS_KEY_OBJECT,
        Body=secrets.token_hex(32).encode(),
        ServerSideEncryption="AES256",
    )


def records_key_source(cfg: DeployConfig) -> list[dict[str, Any]]:
    """The proxy container's AdditionalModelDataSources: the key's prefix, uncompressed."""
    return [
        {
            "ChannelName": RECORDS_KEY_CHANNEL,
            "S3DataSource": {
                "S3Uri": cfg.key_prefix,
                "S3DataType": "S3Prefix",
                "CompressionType": "None",
            },
        }
    ]


@dataclass(frozen=True)
class Names:
    model: str
    config: str
    endpoint: str
    resource_id: str  # Application Auto Scaling's name for the endpoint variant

    @classmethod
    def of(cls, name: str) -> Names:
        return cls(f"{name}-model", f"{name}-config", name, f"endpoint/{name}/variant/{VARIANT}")


def ubatch(cfg: DeployConfig) -> tuple[int, int]:
    """llama-server's -ub and what the proxy is told of it (PROXY_UPSTREAM_UBATCH)."""
    return (GPU_UBATCH, 0) if cfg.gpu else (CPU_UBATCH, CPU_UBATCH)


def proxy_environment(cfg: DeployConfig) -> dict[str, str]:
    """What the proxy must know of llama-server's flags (in the single image, the
    entrypoint hands it to the proxy), and, with Data Capture on, that its answers carry
    their decision records (the capture is where they are kept)."""
    env = {"PROXY_UPSTREAM_UBATCH": str(ubatch(cfg)[1])}
    if cfg.capture_s3_uri is not None:
        env["PROXY_DECISION_RECORDS"] = CAPTURE_RECORDS
        env["PROXY_DECISION_RECORDS_KEY_FILE"] = RECORDS_KEY_FILE
    return env


def llama_environment(cfg: DeployConfig) -> dict[str, str]:
    """llama-server's settings as our images read them (LLAMA_ARG_*) or the DLC does
    (SM_LLAMA_CPP_*, each becoming a flag: SM_LLAMA_CPP_PARALLEL=4 is --parallel 4)."""
    settings = {
        "N_PARALLEL": cfg.parallel,
        "CTX_SIZE": cfg.ctx_size,
        "UBATCH": ubatch(cfg)[0],
        "CACHE_RAM": CACHE_RAM_MIB,
    }
    if cfg.gpu:
        settings["N_GPU_LAYERS"] = GPU_LAYERS
    if cfg.layout != "dlc":
        return {f"LLAMA_ARG_{key}": str(value) for key, value in settings.items()}
    env = {f"SM_LLAMA_CPP_{_DLC_NAMES[key]}": str(value) for key, value in settings.items()}
    env["SM_LLAMA_CPP_PORT"] = str(DLC_PORT)
    return env


def model_request(cfg: DeployConfig) -> dict[str, Any]:
    request: dict[str, Any] = {"ModelName": Names.of(cfg.name).model, "ExecutionRoleArn": cfg.role}
    if cfg.layout == "single":
        request["PrimaryContainer"] = {
            "Image": cfg.image,
            "ModelDataUrl": cfg.model_data,
            "Environment": {**llama_environment(cfg), **proxy_environment(cfg)},
        }
        if cfg.capture_s3_uri is not None:
            request["PrimaryContainer"]["AdditionalModelDataSources"] = records_key_source(cfg)
        return request
    upstream = f"http://127.0.0.1:{DLC_PORT}" if cfg.layout == "dlc" else cfg.upstream_url
    proxy = {
        "ContainerHostname": PROXY_HOSTNAME,
        "Image": cfg.proxy_image,
        "Environment": {
            "PROXY_HOST": "0.0.0.0",
            "UPSTREAM_URL": upstream,
            **proxy_environment(cfg),
        },
    }
    if cfg.capture_s3_uri is not None:
        proxy["AdditionalModelDataSources"] = records_key_source(cfg)
    llama_image = cfg.llama_image
    if cfg.layout == "dlc":
        llama_image = cfg.dlc_image or DLC_IMAGES["gpu" if cfg.gpu else "cpu"]
    llama = {
        "ContainerHostname": LLAMA_HOSTNAME,
        "Image": llama_image,
        "ModelDataUrl": cfg.model_data,
        "Environment": llama_environment(cfg),
    }
    request["Containers"] = [proxy, llama]
    request["InferenceExecutionConfig"] = {"Mode": "Direct"}
    return request


def endpoint_config_request(cfg: DeployConfig) -> dict[str, Any]:
    names = Names.of(cfg.name)
    variant = {
        "VariantName": VARIANT,
        "ModelName": names.model,
        "InstanceType": cfg.instance_type,
        "InitialInstanceCount": cfg.min_instances,
        "ContainerStartupHealthCheckTimeoutInSeconds": cfg.startup_timeout_s,
        "ModelDataDownloadTimeoutInSeconds": cfg.startup_timeout_s,
    }
    if cfg.gpu:
        variant["InferenceAmiVersion"] = GPU_AMI
    request: dict[str, Any] = {"EndpointConfigName": names.config, "ProductionVariants": [variant]}
    capture = data_capture_config(cfg)
    if capture is not None:
        request["DataCaptureConfig"] = capture
    return request


def data_capture_config(cfg: DeployConfig) -> dict[str, Any] | None:
    """CreateEndpointConfig's DataCaptureConfig, or None without ``--capture``: the answers
    only (Data Capture records requests too unless told not to), requests on
    ``--capture-inputs``; JSON content types declared, so the captures are JSON text."""
    if cfg.capture_s3_uri is None:
        return None
    modes = ["Input", "Output"] if cfg.capture_inputs else ["Output"]
    return {
        "EnableCapture": True,
        "InitialSamplingPercentage": cfg.capture_percent,
        "DestinationS3Uri": cfg.capture_s3_uri,
        "CaptureOptions": [{"CaptureMode": mode} for mode in modes],
        "CaptureContentTypeHeader": {"JsonContentTypes": list(CAPTURE_JSON_TYPES)},
    }


def scaling_policy_request(cfg: DeployConfig) -> dict[str, Any]:
    return {
        "PolicyName": f"{cfg.name}-concurrency",
        "ServiceNamespace": "sagemaker",
        "ResourceId": Names.of(cfg.name).resource_id,
        "ScalableDimension": SCALABLE_DIMENSION,
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": cfg.target_concurrency,
            "PredefinedMetricSpecification": {"PredefinedMetricType": SCALING_METRIC},
            "ScaleOutCooldown": 60,
            "ScaleInCooldown": 300,
        },
    }


def create(cfg: DeployConfig, clients: Clients, *, wait: bool = True) -> Names:
    """Model, endpoint config, endpoint, then auto scaling (which needs the endpoint InService)."""
    names = Names.of(cfg.name)
    if cfg.capture_s3_uri is not None:
        ensure_records_key(cfg, clients)
    sagemaker = clients("sagemaker")
    sagemaker.create_model(**model_request(cfg))
    sagemaker.create_endpoint_config(**endpoint_config_request(cfg))
    sagemaker.create_endpoint(EndpointName=names.endpoint, EndpointConfigName=names.config)
    if wait:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=names.endpoint, WaiterConfig={"Delay": 30, "MaxAttempts": 120}
        )
    autoscaling = clients("application-autoscaling")
    autoscaling.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=names.resource_id,
        ScalableDimension=SCALABLE_DIMENSION,
        MinCapacity=cfg.min_instances,
        MaxCapacity=cfg.max_instances,
    )
    autoscaling.put_scaling_policy(**scaling_policy_request(cfg))
    return names


def delete(name: str, clients: Clients, *, wait: bool = True) -> Names:
    """Remove everything ``create`` made, newest first; what is already gone is skipped."""
    names = Names.of(name)
    autoscaling = clients("application-autoscaling")
    sagemaker = clients("sagemaker")
    target = {
        "ServiceNamespace": "sagemaker",
        "ResourceId": names.resource_id,
        "ScalableDimension": SCALABLE_DIMENSION,
    }
    # "-invocations": the policy endpoints made before scaling on concurrency carry
    for policy in (f"{name}-concurrency", f"{name}-invocations"):
        _ignore_gone(autoscaling.delete_scaling_policy, PolicyName=policy, **target)
    _ignore_gone(autoscaling.deregister_scalable_target, **target)
    if _ignore_gone(sagemaker.delete_endpoint, EndpointName=names.endpoint) and wait:
        sagemaker.get_waiter("endpoint_deleted").wait(
            EndpointName=names.endpoint, WaiterConfig={"Delay": 15, "MaxAttempts": 80}
        )
    _ignore_gone(sagemaker.delete_endpoint_config, EndpointConfigName=names.config)
    _ignore_gone(sagemaker.delete_model, ModelName=names.model)
    return names


@dataclass(frozen=True)
class TransformConfig:
    name: str  # the job's; a model it creates is "<name>-model"
    input: str  # s3:// prefix of .jsonl files, one decision request per line
    output: str  # s3:// prefix; each input file's answers in "<file>.out", line for line
    model: str | None = None  # an existing single-image model; else made from the three below
    image: str | None = None
    model_data: str | None = None
    role: str | None = None
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    invocations_timeout_s: int = 3600  # per payload; SageMaker allows 1-3600
    # per payload (SageMaker allows up to 100): every line of it must be answered within
    # the invocation timeout, about 2 lines/s for a small model on a small CPU instance
    max_payload_mb: int = 1
    max_retries: int = 1  # a payload that failed whole (its lines answer their own errors)
    parallel: int = 4
    ctx_size: int = 32768

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: letters, digits and '-', at most 56 characters")
        for what, url in (("input", self.input), ("output", self.output)):
            if not url.startswith("s3://"):
                raise ValueError(f"{what} must be an s3:// URL")
        if (self.model is None) == (self.image is None):
            raise ValueError("give --model (an existing single-image model) or --image")
        if self.image is not None and not (self.model_data and self.role):
            raise ValueError("--image needs --model-data and --role to create the model")
        if not 1 <= self.invocations_timeout_s <= 3600:
            raise ValueError("invocations timeout: 1 to 3600 seconds")
        if not 1 <= self.max_payload_mb <= 100:
            raise ValueError("max payload: 1 to 100 MB")
        if not 0 <= self.max_retries <= 3:
            raise ValueError("max retries: 0 to 3")
        if self.instance_count < 1:
            raise ValueError("instance count must be at least 1")

    def model_config(self) -> DeployConfig:
        assert self.image and self.model_data and self.role
        return DeployConfig(
            name=self.name,
            model_data=self.model_data,
            role=self.role,
            image=self.image,
            instance_type=self.instance_type,
            parallel=self.parallel,
            ctx_size=self.ctx_size,
        )


def transform_request(cfg: TransformConfig) -> dict[str, Any]:
    """CreateTransformJob: lines split and batched into payloads (SplitType Line,
    MultiRecord), one payload at a time per instance (the proxy reads a payload's lines
    over every llama-server slot), answers assembled line for line."""
    return {
        "TransformJobName": cfg.name,
        "ModelName": cfg.model or Names.of(cfg.name).model,
        "MaxConcurrentTransforms": 1,
        "MaxPayloadInMB": cfg.max_payload_mb,
        "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {
            "InvocationsTimeoutInSeconds": cfg.invocations_timeout_s,
            "InvocationsMaxRetries": cfg.max_retries,
        },
        # the proxy answers every payload within the job's timeout (late lines get 504
        # records) and takes payloads as large as the job sends. Batch Transform sends no
        # header of the caller's, so each line's decision deadline is the container's own:
        # the job's timeout (not the real-time 50 s), as is its maximum and each llama-server
        # call's (one read of a long state on a slow model takes minutes)
        "Environment": {
            "PROXY_INVOCATIONS_TIMEOUT": str(cfg.invocations_timeout_s),
            "PROXY_DEADLINE": str(cfg.invocations_timeout_s),
            "PROXY_MAX_DEADLINE": str(cfg.invocations_timeout_s),
            "PROXY_REQUEST_TIMEOUT": str(cfg.invocations_timeout_s),
            "PROXY_MAX_BODY_BYTES": str(cfg.max_payload_mb * MIB),
        },
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": cfg.input}},
            "ContentType": "application/jsonlines",
            "SplitType": "Line",
            "CompressionType": "None",
        },
        "TransformOutput": {
            "S3OutputPath": cfg.output,
            "Accept": "application/jsonlines",
            "AssembleWith": "Line",
        },
        "TransformResources": {
            "InstanceType": cfg.instance_type,
            "InstanceCount": cfg.instance_count,
        },
    }


def transform(cfg: TransformConfig, clients: Clients, *, wait: bool = True) -> dict[str, str]:
    """The model (unless ``--model`` names one), then the job; waits for it to end."""
    sagemaker = clients("sagemaker")
    if cfg.model is None:
        sagemaker.create_model(**model_request(cfg.model_config()))
    request = transform_request(cfg)
    sagemaker.create_transform_job(**request)
    if wait:
        sagemaker.get_waiter("transform_job_completed_or_stopped").wait(
            TransformJobName=cfg.name, WaiterConfig={"Delay": 30, "MaxAttempts": 2880}
        )
    status = sagemaker.describe_transform_job(TransformJobName=cfg.name)
    return {
        "job": cfg.name,
        "model": request["ModelName"],
        "status": status["TransformJobStatus"],
        "output": cfg.output,
    }


def _ignore_gone(call: Callable[..., Any], **kwargs: Any) -> bool:
    """Run ``call``; False when AWS says the resource does not exist."""
    from botocore.exceptions import ClientError

    try:
        call(**kwargs)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code"), str(error.get("Message", "")).lower()
        # SageMaker (and moto) report a missing resource as a ValidationException
        if code in _GONE or (code == "ValidationException" and _MISSING.search(message)):
            return False
        raise
    return True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m deploy", description=_SUMMARY)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("create", help="create model, endpoint config, endpoint, scaling")
    drop = sub.add_parser("delete", help="delete everything create made")
    job = sub.add_parser("transform", help="run a Batch Transform job on the single image")
    for p in (make, drop, job):
        p.add_argument("--name", required=True, help="endpoint or job name; others derive from it")
        p.add_argument("--region", help="AWS region (default: the boto3 default)")
        p.add_argument("--no-wait", action="store_true", help="do not wait for the endpoint/job")
    for p in (make, job):
        p.add_argument("--image", help="ECR URI of Dockerfile.single's image (one container)")
        p.add_argument("--model-data", help="s3:// URL of a tar.gz holding a .gguf")
        p.add_argument("--role", help="SageMaker execution role ARN")
        p.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
        p.add_argument("--parallel", type=int, default=DeployConfig.parallel, help="llama slots")
        p.add_argument("--ctx-size", type=int, default=DeployConfig.ctx_size, help="llama context")
    make.add_argument("--proxy-image", help="ECR URI of Dockerfile.proxy's image")
    make.add_argument("--llama-image", help="ECR URI of Dockerfile.llama's image")
    make.add_argument(
        "--llama-dlc",
        action="store_true",
        help="AWS's llama.cpp container, unchanged, beside --proxy-image",
    )
    make.add_argument("--dlc-image", help="the llama.cpp DLC's URI (default: by instance type)")
    make.add_argument(
        "--capture",
        metavar="S3_URI",
        help="turn on Data Capture of the answers (with their decision records) to this s3:// URI",
    )
    make.add_argument(
        "--capture-percent",
        type=int,
        default=DeployConfig.capture_percent,
        help="share of invocations captured, 1-100 (InitialSamplingPercentage)",
    )
    make.add_argument(
        "--capture-inputs",
        action="store_true",
        help="capture the requests too (they hold the conversations; off by default)",
    )
    make.add_argument(
        "--records-key",
        metavar="S3_PREFIX",
        help="with --capture: an s3:// prefix of its own holding records.key, the prompt "
        "hashes' key (created when missing; default <name>-records-key/ beside the model "
        "data; not in the capture bucket)",
    )
    make.add_argument("--min-instances", type=int, default=DeployConfig.min_instances)
    make.add_argument("--max-instances", type=int, default=DeployConfig.max_instances)
    make.add_argument(
        "--target-concurrency",
        type=float,
        default=DeployConfig.target_concurrency,
        help="requests in flight or queued per instance that auto scaling aims for",
    )
    job.add_argument("--model", help="an existing single-image model (instead of --image)")
    job.add_argument("--input", required=True, help="s3:// prefix of the .jsonl input")
    job.add_argument("--output", required=True, help="s3:// prefix for the answers")
    job.add_argument("--instance-count", type=int, default=TransformConfig.instance_count)
    job.add_argument(
        "--invocations-timeout",
        type=int,
        default=TransformConfig.invocations_timeout_s,
        help="seconds one payload may take (InvocationsTimeoutInSeconds)",
    )
    job.add_argument("--max-payload-mb", type=int, default=TransformConfig.max_payload_mb)
    job.add_argument("--max-retries", type=int, default=TransformConfig.max_retries)
    return parser


def _config(args: argparse.Namespace) -> DeployConfig | TransformConfig:
    if args.command == "transform":
        return TransformConfig(
            name=args.name,
            input=args.input,
            output=args.output,
            model=args.model,
            image=args.image,
            model_data=args.model_data,
            role=args.role,
            instance_type=args.instance_type,
            instance_count=args.instance_count,
            invocations_timeout_s=args.invocations_timeout,
            max_payload_mb=args.max_payload_mb,
            max_retries=args.max_retries,
            parallel=args.parallel,
            ctx_size=args.ctx_size,
        )
    if not (args.model_data and args.role):
        raise ValueError("create needs --model-data and --role")
    return DeployConfig(
        name=args.name,
        model_data=args.model_data,
        role=args.role,
        image=args.image,
        proxy_image=args.proxy_image,
        llama_image=args.llama_image,
        llama_dlc=args.llama_dlc,
        dlc_image=args.dlc_image,
        instance_type=args.instance_type,
        min_instances=args.min_instances,
        max_instances=args.max_instances,
        target_concurrency=args.target_concurrency,
        parallel=args.parallel,
        ctx_size=args.ctx_size,
        capture_s3_uri=args.capture,
        capture_percent=args.capture_percent,
        capture_inputs=args.capture_inputs,
        records_key=args.records_key,
    )


def main(argv: Sequence[str] | None = None, *, clients: Clients | None = None) -> int:
    args = _parser().parse_args(argv)
    if clients is None:
        import boto3

        clients = boto3.Session(region_name=args.region).client
    if args.command == "delete":
        names = delete(args.name, clients, wait=not args.no_wait)
        print(json.dumps({"command": "delete", **dataclasses.asdict(names)}))
        return 0
    try:
        cfg = _config(args)
    except ValueError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 2
    if isinstance(cfg, TransformConfig):
        print(
            json.dumps({"command": "transform", **transform(cfg, clients, wait=not args.no_wait)})
        )
        return 0
    names = create(cfg, clients, wait=not args.no_wait)
    target = None if cfg.layout == "single" else PROXY_HOSTNAME
    print(
        json.dumps(
            {
                "command": "create",
                "layout": cfg.layout,
                "target_container_hostname": target,
                "records_key": cfg.capture_s3_uri and cfg.key_prefix + RECORDS_KEY_OBJECT,
                **dataclasses.asdict(names),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
