#!/bin/sh
# Entrypoint of the single image (Dockerfile.single): llama-server and the proxy in one
# container under supervisord (docker/supervisord.conf), for SageMaker Batch Transform
# (which calls the model's one container) and real-time endpoints alike.
# SageMaker starts containers as `docker run IMAGE serve`: drop that argument.
# Ports, from what SageMaker documents and nothing guessed:
# - the proxy listens on SAGEMAKER_BIND_TO_PORT, else PROXY_PORT, else 8080 (the port
#   SageMaker calls /ping and /invocations on);
# - llama-server listens on 127.0.0.1 only, on LLAMA_ARG_PORT if set, else on the first
#   port of SAGEMAKER_SAFE_PORT_RANGE ("XXXX-YYYY", where SageMaker says a container's
#   extra ports go) that is not the proxy's, else on 8081. The proxy is told that port.
# llama-server's physical batch (-ub) is LLAMA_ARG_UBATCH, 63 unless set: on CPU the proxy
# then reads new conversations in one request, bit for bit repeatable
# (docs/repeatability.md). The proxy is told the same value (PROXY_UPSTREAM_UBATCH), or 0
# (unknown: the GPU setting, with LLAMA_ARG_UBATCH=512) when PROXY_UPSTREAM_UBATCH=0 says
# so; any other PROXY_UPSTREAM_UBATCH than llama-server's -ub is refused.
# llama-server's host-memory prompt cache is off (LLAMA_ARG_CACHE_RAM, 0 unless set): on, it
# moves a saved state into another slot, which the proxy sees as an unexpected reuse (the
# prompt read twice) and whose last row may have been evaluated alone, which a longer prompt
# must not build on.
# Everything else is configured as in the two images: LLAMA_ARG_* and LLAMA_MODEL_DIR for
# llama-server (docker/llama-entrypoint.sh), PROXY_* for the proxy.
# Tests run it outside a container: SUPERVISORD, SEMIF_SUPERVISOR_CONF,
# SEMIF_LLAMA_ENTRYPOINT and SEMIF_PROXY_ENTRYPOINT name the pieces.
set -eu

if [ "${1:-}" = "serve" ]; then
    shift
fi

proxy_port="${SAGEMAKER_BIND_TO_PORT:-${PROXY_PORT:-8080}}"
llama_port="${LLAMA_ARG_PORT:-}"
if [ -z "$llama_port" ] && [ -n "${SAGEMAKER_SAFE_PORT_RANGE:-}" ]; then
    low="${SAGEMAKER_SAFE_PORT_RANGE%-*}"
    high="${SAGEMAKER_SAFE_PORT_RANGE#*-}"
    llama_port="$low"
    if [ "$llama_port" = "$proxy_port" ]; then
        llama_port=$((low + 1))
    fi
    if [ "$llama_port" -gt "$high" ]; then
        echo "single-entrypoint: SAGEMAKER_SAFE_PORT_RANGE=$SAGEMAKER_SAFE_PORT_RANGE" \
             "leaves no port for llama-server beside the proxy's $proxy_port" >&2
        exit 64
    fi
fi
llama_port="${llama_port:-8081}"
if [ "$llama_port" = "$proxy_port" ]; then
    echo "single-entrypoint: llama-server and the proxy would both listen on $proxy_port" >&2
    exit 64
fi

# exit 64 unless $2 is a whole number above 0; $1 names the variable, $3 says what it is
positive() {
    case "$2" in
        "" | 0* | *[!0-9]*)
            echo "single-entrypoint: $1=$2 is not $3" >&2
            exit 64 ;;
    esac
}

llama_ubatch="${LLAMA_ARG_UBATCH:-63}"
positive LLAMA_ARG_UBATCH "$llama_ubatch" "a batch size"
llama_cache_ram="${LLAMA_ARG_CACHE_RAM:-0}"
case "$llama_cache_ram" in
    0 | -1) ;;
    "" | 0* | *[!0-9]*)
        echo "single-entrypoint: LLAMA_ARG_CACHE_RAM=$llama_cache_ram is not a size in MiB" >&2
        exit 64 ;;
esac
if [ "$llama_cache_ram" != 0 ]; then
    echo "single-entrypoint: warning: LLAMA_ARG_CACHE_RAM=$llama_cache_ram turns" \
         "llama-server's prompt cache on; the proxy's reads expect it off (0)" >&2
fi
proxy_ubatch="${PROXY_UPSTREAM_UBATCH:-$llama_ubatch}"
if [ "$proxy_ubatch" != 0 ] && [ "$proxy_ubatch" != "$llama_ubatch" ]; then
    echo "single-entrypoint: PROXY_UPSTREAM_UBATCH=$proxy_ubatch, but llama-server's -ub" \
         "is $llama_ubatch (LLAMA_ARG_UBATCH); set it to that, or 0 for unknown" >&2
    exit 64
fi

# llama-server's HTTP threads: two calls per slot (one running, one waiting in its queue to
# start with the next batch) and 4 more; the proxy may use all but one (docs/operations.md)
llama_parallel="${LLAMA_ARG_N_PARALLEL:-4}"
positive LLAMA_ARG_N_PARALLEL "$llama_parallel" "a slot count"
llama_threads_http="${LLAMA_ARG_THREADS_HTTP:-$((2 * llama_parallel + 4))}"
positive LLAMA_ARG_THREADS_HTTP "$llama_threads_http" "a thread count"
proxy_connections="${PROXY_MAX_CONNECTIONS:-$((llama_threads_http - 1))}"

SEMIF_RUN_DIR="${SEMIF_RUN_DIR:-/tmp}"
SEMIF_LLAMA_COMMAND="env -u SAGEMAKER_BIND_TO_PORT LLAMA_ARG_HOST=127.0.0.1 \
LLAMA_ARG_PORT=$llama_port LLAMA_ARG_UBATCH=$llama_ubatch LLAMA_ARG_CACHE_RAM=$llama_cache_ram \
LLAMA_ARG_THREADS_HTTP=$llama_threads_http ${SEMIF_LLAMA_ENTRYPOINT:-/usr/local/bin/llama-entrypoint.sh}"
SEMIF_PROXY_COMMAND="env PROXY_PORT=$proxy_port UPSTREAM_URL=http://127.0.0.1:$llama_port \
PROXY_UPSTREAM_UBATCH=$proxy_ubatch PROXY_MAX_CONNECTIONS=$proxy_connections \
${SEMIF_PROXY_ENTRYPOINT:-/usr/local/bin/proxy-entrypoint.sh}"
export SEMIF_RUN_DIR SEMIF_LLAMA_COMMAND SEMIF_PROXY_COMMAND

echo "single-entrypoint: proxy on port $proxy_port, llama-server on 127.0.0.1:$llama_port" \
     "with -ub $llama_ubatch (the proxy told $proxy_ubatch), --cache-ram $llama_cache_ram" >&2
exec "${SUPERVISORD:-supervisord}" -c "${SEMIF_SUPERVISOR_CONF:-/etc/semif/supervisord.conf}"
