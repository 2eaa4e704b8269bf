#!/usr/bin/env bash
# What an allkeys-lru Redis keeps of keys read through corral while other keys fill it: one
# redis-server (maxmemory 20mb, allkeys-lru) and one corral per run, on free 127.0.0.1 ports;
# ten keys (hot0..hot9) read over four connections through corral for 9 s while, from the
# third second, 500,000 keys of 100 bytes are written directly in five bursts a second apart.
# Prints how many of the ten Redis still holds, its evicted_keys, and each key's OBJECT
# IDLETIME (- for a key evicted). FLAGS go to corral: compare --no-cache, the default
# (touch_ms = 250) and a config with touch_ms = 0.
#
# Usage: scripts/touch-eviction.sh [FLAG...]
#   e.g. scripts/touch-eviction.sh --no-cache; scripts/touch-eviction.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CORRAL:-target/release/corral} LOAD=target/release/corral-load
[ -x "$BIN" ] && [ -x "$LOAD" ] || cargo build --release --bins >&2
WORK=$(mktemp -d /tmp/corral-touch.XXXXXX)
PIDS=()
# shellcheck source=scripts/procs.sh
. scripts/procs.sh

REDIS_PORT=$(free_port) PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save '' --appendonly no --maxmemory 20mb \
  --maxmemory-policy allkeys-lru >"$WORK/redis.log" 2>&1 &
PIDS+=("$!")
wait_ready "$REDIS_PORT" redis "${PIDS[0]}"
"$BIN" --listen "127.0.0.1:$PORT" --upstream "redis://127.0.0.1:$REDIS_PORT" "$@" \
  >"$WORK/corral.log" 2>&1 &
PIDS+=("$!")
wait_ready "$PORT" corral "${PIDS[1]}"
for i in $(seq 0 9); do redis-cli -p "$REDIS_PORT" SET "hot$i" v >/dev/null; done
"$LOAD" --addr "127.0.0.1:$PORT" -c 4 -P 1 -k 10 --key-prefix hot --dist uniform \
  --get-ratio 1 --duration 9 --csv >"$WORK/load.csv" &
LOAD_PID=$!
sleep 3
for burst in 1 2 3 4 5; do
  "$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k 100000 -d 100 --key-prefix "filler$burst:" \
    >/dev/null 2>&1
  sleep 1
done
wait "$LOAD_PID"
left=0 idle=""
for i in $(seq 0 9); do
  if [ "$(redis-cli -p "$REDIS_PORT" EXISTS "hot$i")" = 1 ]; then
    left=$((left + 1))
    idle="$idle $(redis-cli -p "$REDIS_PORT" OBJECT IDLETIME "hot$i")"
  else
    idle="$idle -"
  fi
done
evicted=$(redis-cli -p "$REDIS_PORT" INFO stats | tr -d '\r' | sed -n 's/^evicted_keys://p')
echo "corral $*: $left of 10 read keys left, evicted_keys $evicted, idle (s):$idle"
