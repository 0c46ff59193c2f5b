#!/bin/sh
# Entrypoint of the proxy image.
# SageMaker starts containers as `docker run IMAGE serve`: drop that argument.
# In a multi-container endpoint SageMaker names the port in SAGEMAKER_BIND_TO_PORT;
# it wins over PROXY_PORT. Everything else reaches `python -m proxy` unchanged.
# PROXY_PYTHON names the interpreter (tests point it at a fake).
set -eu

if [ "${1:-}" = "serve" ]; then
    shift
fi

if [ -n "${SAGEMAKER_BIND_TO_PORT:-}" ]; then
    PROXY_PORT="$SAGEMAKER_BIND_TO_PORT"
    export PROXY_PORT
fi

exec "${PROXY_PYTHON:-python}" -m proxy "$@"
