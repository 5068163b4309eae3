# syntax=docker/dockerfile:1
# The batchpilot runtime for PyTorch programs: the batching inference server with the torch engine
# (`--engine torch`, TorchScript and torch.export). It installs the project with the `runtime` and
# `torch` extras and nothing else. PyPI's Linux torch is CUDA's build, CUDA 13 and cuDNN 9 as
# NVIDIA's wheels, so one image serves on a GPU node and, where PyTorch sees no GPU, on the CPU;
# the base is CUDA's smallest image (the container toolkit's settings), as for the GPU runtime.
# The GPU driver comes from the node. The operator runs it for `spec.model.format` torchscript
# and torch-export (its runtime_image_torch setting, the chart's runtime.images.torch).
# Build from the repository root: docker build -f images/runtime-torch.Dockerfile -t IMAGE .
# tests/deploy/test_images.py checks what this file installs, its pins and its user.

# CUDA 13.0 on Ubuntu 24.04 (Python 3.12), pinned by version and digest (hack/pin-base-images.sh).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04@sha256:2ab6381d970b211fb93853796dc6707eb8a72575a375c422b17cf4d8b2641701

FROM ${CUDA_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY images/constraints/build.txt images/constraints/runtime-torch.txt /constraints/
# Ubuntu's Python is externally managed (PEP 668): the build tools get a venv of their own.
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --requirement /constraints/build.txt
COPY pyproject.toml README.md ./
COPY api/ api/
COPY runtime/ runtime/
COPY operator/ operator/
# The wheel holds only the project's code; its dependencies come from the extras, at the
# versions pinned in images/constraints/ (hack/pin-image-deps.py). The venv gets no pip.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && python3 -m venv --without-pip /opt/venv \
 && /opt/build/bin/pip --python /opt/venv/bin/python install \
      --constraint /constraints/runtime-torch.txt "$(ls /wheels/batchpilot-*.whl)[runtime,torch]"

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
# No ld.so cache entries here, unlike the GPU runtime: torch finds the CUDA libraries of its
# NVIDIA wheels in site-packages itself, and this image's onnxruntime is the CPU one.
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Numeric, so that runAsNonRoot can verify it; the uid the operator runs runtime pods as.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["batchpilot"]
CMD ["runtime", "serve", "--help"]
