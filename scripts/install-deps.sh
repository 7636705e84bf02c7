#!/usr/bin/env bash
# Installs the Debian 12 packages kiln builds and tests with, when missing.
# Runs apt-get only if something is missing; uses sudo when not root.
set -euo pipefail

packages=(
  build-essential   # gcc, make, libgomp (OpenMP)
  cmake
  pkg-config
  libcjson-dev      # JSON: safetensors headers, config.json, manifests
  libxxhash-dev     # checksums of the weight cache
  libpng-dev        # latent previews
  libutf8proc-dev   # Unicode data of the tokenizers (NFC, categories, grapheme clusters)
  libdnnl-dev       # oneDNN: GEMM and attention of the fast backend
  libopenmpi-dev    # MPI: tensor, sequence and CFG parallel runs (optional at build time)
  openmpi-bin       # mpirun, for the multi-rank tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kiln: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "kiln: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
