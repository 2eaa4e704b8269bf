#!/usr/bin/env bash
# The whole test suite: installs redis-server (and redis-py) if absent, then checks formatting,
# lints and the doc comments' links (rustdoc, private items included), runs every unit and
# integration test against real redis-server processes, and redis-py's own test suite
# through corral (scripts/redis-py-suite.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo fmt --all --check
cargo clippy --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --document-private-items --quiet
cargo test --all-targets
cargo build --bin corral
scripts/redis-py-suite.sh --corral target/debug/corral
