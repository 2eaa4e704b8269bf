#!/usr/bin/env bash
# Installs what corral's tests and benchmarks need on Debian/Ubuntu, if absent:
# redis-server and redis-cli/redis-benchmark, nutcracker (twemproxy, for the benchmark) and
# the redis-py client library (used by a client-compatibility test), and python3-venv where
# python3 lacks it (redis-py's own suite runs in a venv).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
# redis-py's suite (scripts/redis-py-suite.sh) runs in a venv: Debian's python3 needs this.
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ "${1:-}" = "--bench" ]; then
  command -v nutcracker >/dev/null || need+=(nutcracker)
fi
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  # The Debian package starts a system-wide server on 6379; tests use their own ports.
fi
if ! python3 -c 'import redis' 2>/dev/null; then
  python3 -m pip install --quiet redis 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages redis
fi
