#!/usr/bin/env bash
# Installs the two Rust peer servers that `ursula-bench compare` measures
# against, each pinned to an exact version, into the git-ignored
# `bench/peers/` directory (one `--root` per peer so their binaries never
# collide). Idempotent: a peer already installed at its version is skipped by
# cargo. Compiling both takes several minutes; set CARGO_BUILD_JOBS=1 and run
# under `nice` on a shared machine.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
peers="$here/bench/peers"
mkdir -p "$peers"

install_peer() {
    local crate="$1" version="$2" dir="$3"
    echo "installing $crate $version into $peers/$dir"
    cargo install --locked --version "$version" --root "$peers/$dir" "$crate"
}

only="${1:-all}"
if [[ "$only" == all || "$only" == ds-rust ]]; then
    install_peer durable-streams 0.1.5 ds-rust
fi
if [[ "$only" == all || "$only" == ursula-tonbo ]]; then
    install_peer ursula 0.11.5 ursula-tonbo
fi
