#!/usr/bin/env bash
# Re-pins the images' base images: resolves each base's tag to the digest the registry serves
# now and writes TAG@DIGEST into the Dockerfiles' ARG lines. Run it on a machine with Docker
# (buildx) when moving to a new base; review the diff, then `make images`.
#   hack/pin-base-images.sh                # re-resolve the tags already in the files
#   hack/pin-base-images.sh python:3.12.13-slim-bookworm nvidia/cuda:13.0.3-base-ubuntu24.04
set -euo pipefail
cd "$(dirname "$0")/.."

files=(images/operator.Dockerfile images/runtime.Dockerfile images/runtime-gpu.Dockerfile
       images/runtime-torch.Dockerfile hack/kind/demo-runtime.Dockerfile)

current_tags() {
    sed -nE 's/^ARG (PYTHON|CUDA)_IMAGE=([^@]+)(@sha256:[0-9a-f]{64})?$/\2/p' "${files[@]}" | sort -u
}

tags=("$@")
[ ${#tags[@]} -gt 0 ] || mapfile -t tags < <(current_tags)
for tag in "${tags[@]}"; do
    repository=${tag%:*}
    digest=$(docker buildx imagetools inspect "$tag" --format '{{json .Manifest}}' \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])')
    echo "$tag@$digest"
    # Replace whichever tag of this repository the files pin now.
    sed -i -E "s#^(ARG (PYTHON|CUDA)_IMAGE=)${repository//./\\.}:[^@ ]+(@sha256:[0-9a-f]{64})?\$#\1$tag@$digest#" \
        "${files[@]}"
done
