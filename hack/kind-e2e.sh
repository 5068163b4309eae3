#!/usr/bin/env bash
# make kind-e2e: InferenceServices on the kind cluster from `make kind-up`, end to end.
#   1. apply two CPU services (hack/kind/inferenceservices.yaml): a real classifier, and the
#      same signature on the simulated accelerator
#   2. wait for Ready (the operator created the children and a replica serves)
#   3. send load through the Service (kubectl port-forward + `batchpilot loadgen`)
#   4. wait for MetricsAvailable (Prometheus scraped the pods; the autopilot read it) and for
#      the autopilot's first decision to show in status
#   5. print what kubectl shows; on failure, the operator's log
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=${KIND_CLUSTER:-batchpilot}
batchpilot=${BATCHPILOT:-.venv/bin/batchpilot}
ns="batchpilot-demo"
port=${E2E_LOCAL_PORT:-18080}
kubectl config use-context "kind-$cluster" >/dev/null
step() { printf '\n==> %s\n' "$*"; }

forwarder=""
cleanup() { if [ -n "$forwarder" ]; then kill "$forwarder" 2>/dev/null || true; fi; }
on_failure() {
    echo "kind-e2e: FAILED — the operator's log and the services' events:" >&2
    kubectl -n batchpilot-system logs deploy/batchpilot-operator --tail=100 >&2 || true
    kubectl -n "$ns" describe inferenceservices >&2 || true
}
trap cleanup EXIT
trap on_failure ERR

step "InferenceServices"
kubectl apply -f hack/kind/inferenceservices.yaml
kubectl -n "$ns" wait --for=condition=Ready inferenceservice/orientation \
    inferenceservice/orientation-sim --timeout=300s
kubectl -n "$ns" get inferenceservices

for service in orientation orientation-sim; do
    step "load on $service"
    kubectl -n "$ns" port-forward "svc/$service" "$port:80" >/dev/null &
    forwarder=$!
    for _ in $(seq 50); do
        curl -fsS "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
        sleep 0.2
    done
    "$batchpilot" loadgen --url "http://127.0.0.1:$port" \
        --model orientation --rate 20 --duration 60 --verify
    kill "$forwarder"; wait "$forwarder" 2>/dev/null || true; forwarder=""
done

step "the autopilot reads the metrics"
kubectl -n "$ns" wait --for=condition=MetricsAvailable inferenceservice/orientation \
    inferenceservice/orientation-sim --timeout=180s
kubectl -n "$ns" get inferenceservices
kubectl -n "$ns" describe inferenceservice orientation-sim | sed -n '/Conditions:/,$p'
kubectl -n "$ns" get events --field-selector involvedObject.kind=InferenceService

step "kind-e2e passed"
