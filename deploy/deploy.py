"""Create or delete the sidecar's SageMaker real-time endpoint with boto3.

    python -m deploy.deploy create --name semif --proxy-image URI --llama-image URI \\
        --model-data s3://bucket/model.tar.gz --role arn:aws:iam::123456789012:role/x \\
        [--instance-type ml.c7i.xlarge] [--min-instances 1] [--max-instances 2] \\
        [--target-invocations 20] [--region eu-west-1] [--no-wait]
    python -m deploy.deploy delete --name semif [--region eu-west-1]

It builds what ``deploy/sagemaker.yaml`` builds: one model with two containers in
``Direct`` mode (callers reach ``proxy``; only the proxy talks to ``llama``), an
endpoint config, an endpoint, and target tracking on invocations per instance.
Names derive from ``--name``: model ``<name>-model``, endpoint config
``<name>-config``, endpoint ``<name>``. ``delete`` removes them in reverse order and
treats what is already gone as deleted.

Functions take ``clients``: a callable returning a boto3 client for a service name,
such as ``boto3.Session(region_name=...).client``; tests hand in mocked ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DeployConfig",
    "Names",
    "create",
    "delete",
    "endpoint_config_request",
    "main",
    "model_request",
    "scaling_policy_request",
]

Clients = Callable[[str], Any]

VARIANT = "AllTraffic"
PROXY_HOSTNAME = "proxy"
LLAMA_HOSTNAME = "llama"
DEFAULT_INSTANCE_TYPE = "ml.c7i.xlarge"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
SCALING_METRIC = "SageMakerVariantInvocationsPerInstance"
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,55}$")  # leaves room for "-config"
_SUMMARY = "Create or delete the sidecar's SageMaker real-time endpoint."
_GONE = {"ObjectNotFoundException", "ResourceNotFound"}
_MISSING = re.compile(r"could not find|not found|no .* found|does not exist")


@dataclass(frozen=True)
class DeployConfig:
    name: str
    proxy_image: str
    llama_image: str
    model_data: str
    role: str
    instance_type: str = DEFAULT_INSTANCE_TYPE
    min_instances: int = 1
    max_instances: int = 2
    target_invocations: float = 20.0  # per instance per minute
    upstream_url: str = "http://127.0.0.1:8081"
    parallel: int = 4
    ctx_size: int = 32768
    startup_timeout_s: int = 900  # model download + load before /ping must pass

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: letters, digits and '-', at most 56 characters")
        if not self.model_data.startswith("s3://"):
            raise ValueError("model data must be an s3:// URL")
        if not self.role.startswith("arn:"):
            raise ValueError("role must be an IAM role ARN")
        if not 1 <= self.min_instances <= self.max_instances:
            raise ValueError("need 1 <= min instances <= max instances")
        if not self.target_invocations > 0:
            raise ValueError("target invocations must be positive")


@dataclass(frozen=True)
class Names:
    model: str
    config: str
    endpoint: str
    resource_id: str  # Application Auto Scaling's name for the endpoint variant

    @classmethod
    def of(cls, name: str) -> Names:
        return cls(f"{name}-model", f"{name}-config", name, f"endpoint/{name}/variant/{VARIANT}")


def model_request(cfg: DeployConfig) -> dict[str, Any]:
    proxy = {
        "ContainerHostname": PROXY_HOSTNAME,
        "Image": cfg.proxy_image,
        "Environment": {"PROXY_HOST": "0.0.0.0", "UPSTREAM_URL": cfg.upstream_url},
    }
    llama = {
        "ContainerHostname": LLAMA_HOSTNAME,
        "Image": cfg.llama_image,
        "ModelDataUrl": cfg.model_data,
        "Environment": {
            "LLAMA_ARG_N_PARALLEL": str(cfg.parallel),
            "LLAMA_ARG_CTX_SIZE": str(cfg.ctx_size),
        },
    }
    return {
        "ModelName": Names.of(cfg.name).model,
        "ExecutionRoleArn": cfg.role,
        "Containers": [proxy, llama],
        "InferenceExecutionConfig": {"Mode": "Direct"},
    }


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
    return {"EndpointConfigName": names.config, "ProductionVariants": [variant]}


def scaling_policy_request(cfg: DeployConfig) -> dict[str, Any]:
    return {
        "PolicyName": f"{cfg.name}-invocations",
        "ServiceNamespace": "sagemaker",
        "ResourceId": Names.of(cfg.name).resource_id,
        "ScalableDimension": SCALABLE_DIMENSION,
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": cfg.target_invocations,
            "PredefinedMetricSpecification": {"PredefinedMetricType": SCALING_METRIC},
            "ScaleOutCooldown": 60,
            "ScaleInCooldown": 300,
        },
    }


def create(cfg: DeployConfig, clients: Clients, *, wait: bool = True) -> Names:
    """Model, endpoint config, endpoint, then auto scaling (which needs the endpoint InService)."""
    names = Names.of(cfg.name)
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
    _ignore_gone(autoscaling.delete_scaling_policy, PolicyName=f"{name}-invocations", **target)
    _ignore_gone(autoscaling.deregister_scalable_target, **target)
    if _ignore_gone(sagemaker.delete_endpoint, EndpointName=names.endpoint) and wait:
        sagemaker.get_waiter("endpoint_deleted").wait(
            EndpointName=names.endpoint, WaiterConfig={"Delay": 15, "MaxAttempts": 80}
        )
    _ignore_gone(sagemaker.delete_endpoint_config, EndpointConfigName=names.config)
    _ignore_gone(sagemaker.delete_model, ModelName=names.model)
    return names


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
    parser = argparse.ArgumentParser(prog="python -m deploy.deploy", description=_SUMMARY)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("create", help="create model, endpoint config, endpoint, scaling")
    drop = sub.add_parser("delete", help="delete everything create made")
    for p in (make, drop):
        p.add_argument("--name", required=True, help="endpoint name; other names derive from it")
        p.add_argument("--region", help="AWS region (default: the boto3 default)")
        p.add_argument("--no-wait", action="store_true", help="do not wait for the endpoint")
    make.add_argument("--proxy-image", required=True, help="ECR URI of Dockerfile.proxy's image")
    make.add_argument("--llama-image", required=True, help="ECR URI of Dockerfile.llama's image")
    make.add_argument("--model-data", required=True, help="s3:// URL of a tar.gz holding a .gguf")
    make.add_argument("--role", required=True, help="SageMaker execution role ARN")
    make.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
    make.add_argument("--min-instances", type=int, default=DeployConfig.min_instances)
    make.add_argument("--max-instances", type=int, default=DeployConfig.max_instances)
    make.add_argument(
        "--target-invocations",
        type=float,
        default=DeployConfig.target_invocations,
        help="invocations per instance per minute that auto scaling aims for",
    )
    make.add_argument("--parallel", type=int, default=DeployConfig.parallel, help="llama slots")
    make.add_argument("--ctx-size", type=int, default=DeployConfig.ctx_size, help="llama context")
    return parser


def main(argv: Sequence[str] | None = None, *, clients: Clients | None = None) -> int:
    args = _parser().parse_args(argv)
    if clients is None:
        import boto3

        clients = boto3.Session(region_name=args.region).client
    if args.command == "create":
        try:
            cfg = DeployConfig(
                name=args.name,
                proxy_image=args.proxy_image,
                llama_image=args.llama_image,
                model_data=args.model_data,
                role=args.role,
                instance_type=args.instance_type,
                min_instances=args.min_instances,
                max_instances=args.max_instances,
                target_invocations=args.target_invocations,
                parallel=args.parallel,
                ctx_size=args.ctx_size,
            )
        except ValueError as exc:
            print(f"deploy: {exc}", file=sys.stderr)
            return 2
        names = create(cfg, clients, wait=not args.no_wait)
    else:
        names = delete(args.name, clients, wait=not args.no_wait)
    print(json.dumps({"command": args.command, **dataclasses.asdict(names)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
