# syntax=docker/dockerfile:1
# The operator image: the psoperator package with its `operator` extra (kopf, kubernetes client,
# Prometheus client) and nothing else; no TensorFlow. Build from the repository root:
#   docker build -t ps-training-operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
# Wheels for the package and every runtime dependency, so the final stage needs no build tools.
RUN pip wheel --wheel-dir /wheels ".[operator]"

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/*.whl \
    && groupadd --system --gid 10001 psoperator \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin psoperator
USER 10001:10001
WORKDIR /tmp
# 8080: liveness (/healthz); 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["psoperator"]
CMD ["run", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
