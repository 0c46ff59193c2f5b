#!/bin/sh
# Entrypoint of the llama image: starts the unmodified llama-server.
# SageMaker starts containers as `docker run IMAGE serve`: drop that argument.
# Port: SAGEMAKER_BIND_TO_PORT (multi-container endpoint), else LLAMA_ARG_PORT, else 8081.
# Model: LLAMA_ARG_MODEL, else the first *.gguf (mmproj files skipped) in
# LLAMA_MODEL_DIR (default /opt/ml/model, where SageMaker unpacks ModelDataUrl).
# Other LLAMA_ARG_* variables are read by llama-server itself; extra arguments are passed on.
# LLAMA_SERVER_BIN names the binary (tests point it at a fake).
set -eu

if [ "${1:-}" = "serve" ]; then
    shift
fi

port="${SAGEMAKER_BIND_TO_PORT:-${LLAMA_ARG_PORT:-8081}}"
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

echo "llama-entrypoint: model $model, port $port" >&2
exec "${LLAMA_SERVER_BIN:-/app/llama-server}" \
    --model "$model" \
    --host "${LLAMA_ARG_HOST:-0.0.0.0}" \
    --port "$port" \
    --metrics \
    "$@"
