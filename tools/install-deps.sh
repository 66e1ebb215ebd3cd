#!/usr/bin/env bash
# Installs what moecheck needs on Debian 12 (as root). The CUDA Toolkit is expected at
# /usr/local/cuda already (nvcc is optional: without it the build is CPU-only).
set -euo pipefail
packages=(
  cmake g++ make
  libeigen3-dev libhdf5-dev libgtest-dev googletest librapidcheck-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  python3 python3-numpy python3-h5py python3-pytest
  python3-dev pybind11-dev  # the Python module (python/)
  chromium
  clang libclang-rt-14-dev  # the libFuzzer run of the safetensors parser (tests/checkpoint_fuzz.sh)
)
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages already installed"
fi
