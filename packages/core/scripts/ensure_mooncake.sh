#!/usr/bin/env bash
# Install what the Mooncake L3 tests need, only where it is missing:
#   * libibverbs.so.1 (Debian: libibverbs1) - Mooncake's native modules link
#     against it even for TCP; needs root (CI runs as root).
#   * the Mooncake client wheel (the sgl-core[mooncake] extra).
# Usage: packages/core/scripts/ensure_mooncake.sh [PYTHON]   (default: python)
set -euo pipefail

PYTHON="${1:-python}"
MOONCAKE_REQ="${SGL_MOONCAKE_REQ:-mooncake-transfer-engine-non-cuda==0.3.13.post1}"

if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then
    echo "ensure_mooncake: installing libibverbs1"
    if [ "$(id -u)" -ne 0 ]; then
        echo "ensure_mooncake: libibverbs1 is missing and this is not root" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq libibverbs1
fi

if ! "$PYTHON" -c 'import mooncake.store' 2>/dev/null; then
    echo "ensure_mooncake: installing $MOONCAKE_REQ"
    "$PYTHON" -m pip install -q "$MOONCAKE_REQ"
fi

"$PYTHON" -c 'import mooncake.store; from sgl_core.l3._mooncake_lib import master_binary; print("ensure_mooncake: mooncake master", master_binary())'
