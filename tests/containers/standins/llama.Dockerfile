# Stand-in for ghcr.io/ggml-org/llama.cpp:server-b11434, built where no image registry can
# be reached, laid out as llama.cpp's .devops/cpu.Dockerfile lays out its `server` target:
# llama-server and its libraries in /app, libgomp1 and curl from the distribution, the
# working directory /app, llama-server as the entrypoint, and no Python. The binary is the
# b11434 source build this project makes for the machine's CPU (scripts/prepare.py
# --source), unmodified. Differences, none of which the project's images use: Debian
# bookworm rather than Ubuntu 24.04, and no ffmpeg (llama-server's audio input).
ARG BASE=semif-standin/debian:bookworm
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY app/ /app/
WORKDIR /app
ENV LLAMA_ARG_HOST=0.0.0.0
LABEL org.semif.standin="ghcr.io/ggml-org/llama.cpp:server-b11434"
HEALTHCHECK CMD [ "curl", "-f", "http://localhost:8080/health" ]
ENTRYPOINT [ "/app/llama-server" ]
