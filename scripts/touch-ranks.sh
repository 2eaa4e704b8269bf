#!/usr/bin/env bash
# How recently used Redis sees the keys corral serves from its cache, by how hot they are:
# one redis-server holding 1M keys of 64 bytes and one corral, on free 127.0.0.1 ports;
# corral-load reads Zipf(0.99) keys through corral (GETs only, -P 16, 50 connections) for
# SECS seconds, then Redis's OBJECT IDLETIME (which does not touch) is read for keys by rank
# (the key of rank r is key number r - 1): every rank of 1-64, every 5th of 65-10,064, every
# 45th of 10,000-99,999 and every 450th of 100,000-999,999. Prints, per range, how many are
# idle 2 s or less, 3-9 s and 10 s or more, and corral's cache_touches and entries. FLAGS go
# to corral: compare the default, a config with touch_ms = 0, or another build (CORRAL=BIN).
#
# Usage: scripts/touch-ranks.sh [-s SECS] [FLAG...]
#   e.g. scripts/touch-ranks.sh; CORRAL=/tmp/corral-old scripts/touch-ranks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=15
if [ "${1:-}" = -s ]; then SECS=$2; shift 2; fi
BIN=${CORRAL:-target/release/corral} LOAD=target/release/corral-load
[ -x "$BIN" ] && [ -x "$LOAD" ] || cargo build --release --bins >&2
WORK=$(mktemp -d /tmp/corral-ranks.XXXXXX)
PIDS=()
# shellcheck source=scripts/procs.sh
. scripts/procs.sh

REDIS_PORT=$(free_port) PORT=$(free_port) ADMIN=$(free_port)
redis-server --port "$REDIS_PORT" --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
PIDS+=("$!")
wait_ready "$REDIS_PORT" redis "${PIDS[0]}"
"$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k 1000000 -d 64 >/dev/null
"$BIN" --listen "127.0.0.1:$PORT" --upstream "redis://127.0.0.1:$REDIS_PORT" \
  --admin "127.0.0.1:$ADMIN" "$@" >"$WORK/corral.log" 2>&1 &
PIDS+=("$!")
wait_ready "$PORT" corral "${PIDS[1]}"
"$LOAD" --addr "127.0.0.1:$PORT" -P 16 -k 1000000 --dist zipf --get-ratio 1 \
  --duration "$SECS" --csv >"$WORK/load.csv"
metrics=$(curl -s "127.0.0.1:$ADMIN/metrics")
touches=$(echo "$metrics" | awk '/^corral_cache_touches_total /{print $2}')
entries=$(echo "$metrics" | awk '/^corral_cache_entries /{print $2}')
# corral-load pads key numbers to the width of the largest.
width=$(($(redis-cli -p "$REDIS_PORT" RANDOMKEY | wc -c) - 5))
echo "corral $*: ${SECS} s of Zipf GETs, cache_touches $touches, entries $entries"
report() { # NAME FIRST LAST STEP
  local n=0 fresh=0 mid=0 old=0 idle
  while read -r idle; do
    n=$((n + 1))
    if [ "$idle" -le 2 ]; then fresh=$((fresh + 1))
    elif [ "$idle" -le 9 ]; then mid=$((mid + 1))
    else old=$((old + 1)); fi
  done < <(seq "$2" "$4" "$3" | while read -r r; do
             printf 'OBJECT IDLETIME key:%0*d\n' "$width" $((r - 1))
           done | redis-cli -p "$REDIS_PORT" | grep -E '^[0-9]+$')
  echo "  ranks $1: $n keys, idle <= 2 s $fresh, 3-9 s $mid, >= 10 s $old"
}
report "1-64" 1 64 1
report "65-10,064" 65 10064 5
report "10,000-99,999" 10000 99999 45
report "100,000-999,999" 100000 999999 450
