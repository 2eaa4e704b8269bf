#!/usr/bin/env bash
# The whole test suite: installs redis-server (and redis-py) if absent, then checks formatting,
# lints, and runs every unit and integration test against real redis-server processes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo fmt --all --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets
