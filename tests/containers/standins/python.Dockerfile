# Stand-in for python:3.11-slim-bookworm, built where no image registry can be reached:
# CPython 3.11 compiled from source into /usr/local on Debian bookworm, as the official
# image builds it (a shared libpython, the system's expat, pip from ensurepip), so that
# `pip install --prefix=/install` then `COPY /install /usr/local`, and `COPY --from` of
# /usr/local into another image, behave as they do with the official image. The source is
# Debian's copy of the upstream tarball (deb.debian.org), checked by its SHA-256; 3.11.2 is
# bookworm's, older than the official image's 3.11 (the suite prints both).
ARG BASE=semif-standin/debian:bookworm
FROM ${BASE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl gcc make libc6-dev \
       libssl-dev libffi-dev zlib1g-dev libbz2-dev liblzma-dev libsqlite3-dev \
       libexpat1-dev uuid-dev libncursesw5-dev libreadline-dev
ARG PYTHON_VERSION=3.11.2
ARG PYTHON_SHA256=2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849
WORKDIR /usr/src/python
RUN curl -fsSL -o python.tgz \
       "http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_${PYTHON_VERSION}.orig.tar.gz" \
    && echo "${PYTHON_SHA256}  python.tgz" | sha256sum -c - \
    && tar -xzf python.tgz --strip-components=1 && rm python.tgz
RUN ./configure --prefix=/usr/local --enable-shared --with-system-expat \
       --with-ensurepip=install --disable-test-modules LDFLAGS=-Wl,--strip-all >/dev/null \
    && make -j"$(nproc)" >/dev/null \
    && make install >/dev/null \
    && find /usr/local/lib/python3.11 -depth -type d \
       \( -name test -o -name tests -o -name idle_test \) -exec rm -rf '{}' +

FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates netbase tzdata libssl3 \
       libffi8 libsqlite3-0 libexpat1 libbz2-1.0 liblzma5 zlib1g libuuid1 libncursesw6 \
       libreadline8 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local /usr/local
RUN ldconfig \
    && ln -s python3 /usr/local/bin/python && ln -s pip3 /usr/local/bin/pip \
    && python -c "import ssl, ctypes, pyexpat, sqlite3, lzma, bz2, zlib, uuid"
ENV LANG=C.UTF-8
LABEL org.semif.standin="python:3.11-slim-bookworm"
CMD ["python3"]
