"""Deployment as code for the semif sidecar: SageMaker (``python -m deploy``, ``sagemaker.yaml``),
Kubernetes (``kubernetes/``)."""
