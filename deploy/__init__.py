"""Deployment as code for the semif sidecar: SageMaker (``deploy.deploy``, ``sagemaker.yaml``)."""
