#!/usr/bin/env bash
# Puts Triton's perf_analyzer (2.45) in VENV/perf-analyzer/ and a launcher at VENV/bin/perf_analyzer,
# for the test that runs Triton's own load tool against the runtime (`make install` runs this).
#
# perf_analyzer is no Python package: it ships as a binary inside tritonclient's Linux wheel
# (tritonclient-X.data/data/bin/perf_analyzer), taken here from PyPI without installing the wheel
# (the dev environment holds a newer tritonclient). The 2.45 binary runs on Debian 12's glibc; it
# loads libb64.so.0d (Debian's libb64-0d, which `make install` installs) and libcudart.so.12,
# taken from the nvidia-cuda-runtime-cu12 wheel (it opens no GPU: the CUDA runtime is only
# linked). Both wheels and the binary are checked against their SHA-256. Idempotent. On a
# machine that is not x86_64 Linux there is no such binary: this says so and does nothing.
set -euo pipefail

venv=${1:?usage: hack/fetch-perf-analyzer.sh VENV}
home="$venv/perf-analyzer"
launcher="$venv/bin/perf_analyzer"
tritonclient=tritonclient==2.45.0
tritonclient_sha256=28b2d550bf5445ccd3f457bbcabf890db1d271924957d4d26abd431f94b078c1
binary_sha256=d442680a17d594ac5acb059e0a0da2ba7c2537d66936ed829154be1355474742
cudart=nvidia-cuda-runtime-cu12==12.9.79
cudart_sha256=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3

if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
    echo "fetch-perf-analyzer: perf_analyzer ships for x86_64 Linux only; its test will skip" >&2
    exit 0
fi
if [ -x "$launcher" ] && echo "$binary_sha256  $home/perf_analyzer" | sha256sum --check --status; then
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for wanted in "$tritonclient $tritonclient_sha256" "$cudart $cudart_sha256"; do
    read -r requirement sha256 <<<"$wanted"
    "$venv/bin/pip" download --quiet --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --dest "$work" "$requirement"
    wheel=$(ls "$work"/"$(echo "${requirement%%==*}" | tr - _)"-*.whl)
    if ! echo "$sha256  $wheel" | sha256sum --check --status; then
        echo "fetch-perf-analyzer: $wheel does not have the expected SHA-256" >&2
        exit 1
    fi
done
mkdir -p "$home/lib"
# Python, not unzip: unzip is not on every fresh machine, python3 is.
python3 - "$work" "$home" <<'PY'
import pathlib, sys, zipfile
work, home = (pathlib.Path(arg) for arg in sys.argv[1:])
(client,) = work.glob("tritonclient-*.whl")
(runtime,) = work.glob("nvidia_cuda_runtime_cu12-*.whl")
with zipfile.ZipFile(client) as wheel:
    (home / "perf_analyzer").write_bytes(
        wheel.read("tritonclient-2.45.0.data/data/bin/perf_analyzer")
    )
with zipfile.ZipFile(runtime) as wheel:
    (home / "lib" / "libcudart.so.12").write_bytes(
        wheel.read("nvidia/cuda_runtime/lib/libcudart.so.12")
    )
PY
if ! echo "$binary_sha256  $home/perf_analyzer" | sha256sum --check --status; then
    echo "fetch-perf-analyzer: the perf_analyzer binary does not have the expected SHA-256" >&2
    exit 1
fi
chmod 0755 "$home/perf_analyzer"
cat >"$launcher" <<EOF
#!/bin/sh
# Triton's perf_analyzer 2.45 (hack/fetch-perf-analyzer.sh), with the CUDA runtime it links.
LD_LIBRARY_PATH="$(cd "$home" && pwd)/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$(cd "$home" && pwd)/perf_analyzer" "\$@"
EOF
chmod 0755 "$launcher"
