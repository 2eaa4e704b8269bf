#!/usr/bin/env bash
# Quick start: builds corral and runs it on 127.0.0.1:6380 in front of a local Redis on 6379,
# installing and starting redis-server first if needed. Extra arguments go to corral.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
if ! redis-cli -p 6379 PING >/dev/null 2>&1; then
  echo "starting redis-server on 127.0.0.1:6379"
  redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --daemonize yes \
    --dir "${TMPDIR:-/tmp}" >/dev/null
  for _ in $(seq 1 50); do redis-cli -p 6379 PING >/dev/null 2>&1 && break; sleep 0.1; done
fi
cargo build --release
exec target/release/corral --config conf/corral.toml --admin 127.0.0.1:9121 "$@"
