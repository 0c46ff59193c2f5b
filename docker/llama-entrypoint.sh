#!/bin/sh
# Entrypoint of the llama image: starts the unmodified llama-server, configured
# through the LLAMA_ARG_* variables it reads itself (arguments given here win over them).
# SageMaker starts containers as `docker run IMAGE serve`: drop that argument.
# Port: SAGEMAKER_BIND_TO_PORT (multi-container endpoint), else LLAMA_ARG_PORT, else 8081.
# Model: LLAMA_ARG_MODEL, else the first *.gguf (mmproj files skipped) in
# LLAMA_MODEL_DIR (default /opt/ml/model, where SageMaker unpacks ModelDataUrl).
# Host 0.0.0.0, the /metrics endpoint and the GGUF's stem as the model id (--alias) unless
# LLAMA_ARG_HOST / _ENDPOINT_METRICS / _ALIAS say otherwise.
# LLAMA_SERVER_BIN names the binary (tests point it at a fake).
set -eu

if [ "${1:-}" = "serve" ]; then
    shift
fi

model="${LLAMA_ARG_MODEL:-}"
model_dir="${LLAMA_MODEL_DIR:-/opt/ml/model}"
if [ -z "$model" ]; then
    for candidate in "$model_dir"/*.gguf; do
        case "${candidate##*/}" in
            mmproj*) continue ;;
        esac
        if [ -f "$candidate" ]; then
            model="$candidate"
            break
        fi
    done
fi
if [ -z "$model" ]; then
    echo "llama-entrypoint: no *.gguf in $model_dir and LLAMA_ARG_MODEL is not set" >&2
    exit 66
fi

LLAMA_ARG_MODEL="$model"
LLAMA_ARG_PORT="${SAGEMAKER_BIND_TO_PORT:-${LLAMA_ARG_PORT:-8081}}"
LLAMA_ARG_HOST="${LLAMA_ARG_HOST:-0.0.0.0}"
LLAMA_ARG_ENDPOINT_METRICS="${LLAMA_ARG_ENDPOINT_METRICS:-1}"
# Served under the file's stem, so /v1/models shows no container paths.
model_name="${model##*/}"
LLAMA_ARG_ALIAS="${LLAMA_ARG_ALIAS:-${model_name%.gguf}}"
export LLAMA_ARG_MODEL LLAMA_ARG_PORT LLAMA_ARG_HOST LLAMA_ARG_ENDPOINT_METRICS LLAMA_ARG_ALIAS

echo "llama-entrypoint: model $LLAMA_ARG_MODEL, port $LLAMA_ARG_PORT" >&2
exec "${LLAMA_SERVER_BIN:-/app/llama-server}" "$@"
