# syntax=docker/dockerfile:1
# The batchpilot operator: kopf, the Kubernetes client, the Prometheus client. It installs the
# project with the `operator` extra and nothing else: never onnxruntime, never the web server.
# Build from the repository root: docker build -f images/operator.Dockerfile -t IMAGE .
# tests/deploy/test_images.py checks what this file installs, its pins and its user.

# Python 3.12 on Debian bookworm, pinned by version and digest (hack/pin-base-images.sh).
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm@sha256:593bd06efe90efa80dc4eee3948be7c0fde4134606dd40d8dd8dbcade98e669c

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY images/constraints/build.txt images/constraints/operator.txt /constraints/
RUN python -m pip install --requirement /constraints/build.txt
COPY pyproject.toml README.md ./
COPY api/ api/
COPY runtime/ runtime/
COPY operator/ operator/
# The wheel holds only the project's code; its dependencies come from the one extra, at the
# versions pinned in images/constraints/ (hack/pin-image-deps.py). The venv gets no pip.
RUN python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/venv \
 && python -m pip --python /opt/venv/bin/python install \
      --constraint /constraints/operator.txt "$(ls /wheels/batchpilot-*.whl)[operator]"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Numeric, so that runAsNonRoot can verify it; the same uid the Helm chart runs the pod as.
USER 65532:65532
ENTRYPOINT ["batchpilot"]
CMD ["operator", "run"]
