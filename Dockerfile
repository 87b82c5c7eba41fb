# The operator image: the psoperator package with its `operator` extra (kopf, kubernetes client,
# Prometheus client) and pstrainer (images/trainer), whose contract module it imports; pstrainer
# depends on nothing, so no TensorFlow comes with it. Build from the repository root:
#   docker build -t ps-training-operator:0.1.0 .
#
# PYTHON_IMAGE may be any Debian-like image with Python >= 3.11 and its venv module: images/build.sh
# passes a local Debian base where no registry is reachable. The package goes into the virtual
# environment /opt/venv, which works whether or not the base's Python is externally managed (PEP 668).
# Behind a TLS-intercepting proxy, give its CA bundle as a build secret (BuildKit):
#   DOCKER_BUILDKIT=1 docker build --secret id=cacert,src=/etc/ssl/certs/ca-certificates.crt ...
# It is mounted over the base's bundle for the download steps only and is in no layer.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# Wheels of the runtime dependencies, read from pyproject.toml alone: a change to the sources
# reuses this stage and the final stage's first layer. pstrainer is this repository's own package,
# built below: never looked up in an index.
FROM ${PYTHON_IMAGE} AS deps
# PIP_CERT: pip's own certifi bundle would ignore the secret above.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
COPY pyproject.toml ./
RUN --mount=type=secret,id=cacert,target=/etc/ssl/certs/ca-certificates.crt \
    python3 -c "import re, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
wanted = [*p['dependencies'], *p['optional-dependencies']['operator']]; \
print(*(d for d in wanted if re.split('[^A-Za-z0-9_.-]', d)[0] != 'pstrainer'), sep='\n')" \
       >requirements.txt \
    && python3 -m pip wheel --wheel-dir /wheels --requirement requirements.txt

# The wheels of psoperator and pstrainer (the network only for their build backend).
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY images/trainer/pyproject.toml images/trainer/README.md images/trainer/
COPY images/trainer/src/ images/trainer/src/
RUN --mount=type=secret,id=cacert,target=/etc/ssl/certs/ca-certificates.crt \
    python3 -m pip wheel --no-deps --wheel-dir /wheels . images/trainer

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PATH=/opt/venv/bin:$PATH
RUN --mount=type=bind,from=deps,source=/wheels,target=/wheels \
    python3 -m venv /opt/venv \
    && pip install --no-index --find-links=/wheels /wheels/*.whl \
    && groupadd --system --gid 10001 psoperator \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin psoperator
# --no-deps: they are all above; the import fails the build if one is missing, the last check if
# TensorFlow came in.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --no-deps /wheels/*.whl \
    && python3 -c "import kopf, kubernetes, prometheus_client, psoperator.cli, psoperator.contract" \
    && python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('tensorflow') is not None)"
USER 10001:10001
WORKDIR /tmp
# 8080: liveness (/healthz); 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["psoperator"]
CMD ["run", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
