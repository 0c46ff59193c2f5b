# Stand-in for prom/prometheus:v3.7.3, built where no image registry can be reached:
# Debian's prometheus package (2.42 in bookworm: the suite prints both versions) laid out
# as the official image is: /bin/prometheus as the entrypoint, the configuration at
# /etc/prometheus/prometheus.yml, the data in /prometheus, run as nobody, port 9090. Debian
# builds its default data path as /var/lib/prometheus/metrics2 (upstream's is ./data, in
# /prometheus): that folder is nobody's too, so a command line that names no path (as
# docker-compose.yml's) runs as it does on the official image.
ARG BASE=semif-standin/debian:bookworm
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && mkdir -p /prometheus /var/lib/prometheus/metrics2 \
    && chown nobody:nogroup /prometheus /var/lib/prometheus/metrics2
LABEL org.semif.standin="prom/prometheus:v3.7.3"
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT [ "/bin/prometheus" ]
CMD [ "--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus" ]
