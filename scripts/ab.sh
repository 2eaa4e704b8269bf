#!/usr/bin/env bash
# Side-by-side runs of corral builds or settings under one corral-load workload, for a change
# too small for scripts/bench.sh to see through the machine's noise. One redis-server (KEYS
# keys of 64 bytes) and one corral per target, each on free 127.0.0.1 ports; every target is
# first loaded for WARM seconds (unmeasured), then ROUNDS interleaved rounds of SECS seconds
# each print the target's requests/s and corral's CPU per request, with its user and system
# parts (utime and stime from /proc/PID/stat around the run), and the shared redis-server's
# CPU per request over the same run, with the commands Redis ran per read of a client's socket
# (its INFO stats: how many requests corral gathered into each write). Compare targets within
# a run, round by round. The warm-up goes round the targets in slices of 5 s (their caches
# about the same age), and each slice and round reads keys of its own (corral-load --seed
# 1000 + slice, then the round's number): no run repeats keys a cache was just shown. --pin
# CLIENT_CPUS:SERVER_CPUS runs corral-load on the first CPUs (taskset lists) and
# redis-server and every corral on the second, as scripts/bench.sh --pin does.
#
# Usage: scripts/ab.sh [-r ROUNDS] [-s SECS] [-w WARM] [-k KEYS] [-P DEPTH] [--dist zipf|uniform]
#                      [--get-ratio R] [--pin C:S] NAME=BIN[,FLAG...] ...
#   e.g. scripts/ab.sh -r 6 new=target/release/corral old=/tmp/corral-old \
#          off=target/release/corral,--no-cache held=target/release/corral,--config,/tmp/h1.toml
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3 SECS=4 WARM=6 KEYS=1000000 DEPTH=16 DIST=zipf RATIO=1.0 PIN=""
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -r) ROUNDS=$2; shift 2 ;;
    -s) SECS=$2; shift 2 ;;
    -w) WARM=$2; shift 2 ;;
    -k) KEYS=$2; shift 2 ;;
    -P) DEPTH=$2; shift 2 ;;
    --dist) DIST=$2; shift 2 ;;
    --get-ratio) RATIO=$2; shift 2 ;;
    --pin) PIN=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *=*) TARGETS+=("$1"); shift ;;
    *) echo "ab.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || { echo "ab.sh: no target (NAME=BIN[,FLAG...])" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "ab.sh: needs redis-server" >&2; exit 1; }
LOAD=target/release/corral-load
[ -x "$LOAD" ] || cargo build --release --bin corral-load >&2

WORK=$(mktemp -d /tmp/corral-ab.XXXXXX)
PIDS=()
# shellcheck source=scripts/procs.sh
. scripts/procs.sh
# Servers start under ON_SERVER; the clients inherit this script's CPUs.
pin_placement "$PIN"

REDIS_PORT=$(free_port)
"${ON_SERVER[@]}" redis-server --port "$REDIS_PORT" --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_ready "$REDIS_PORT" redis "$REDIS_PID"
"$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k "$KEYS" -d 64 >/dev/null

NAMES=() PORTS=() CPIDS=()
for t in "${TARGETS[@]}"; do
  name=${t%%=*}
  IFS=, read -ra argv <<< "${t#*=}"
  port=$(free_port)
  "${ON_SERVER[@]}" "${argv[0]}" --listen "127.0.0.1:$port" \
    --upstream "redis://127.0.0.1:$REDIS_PORT" --log-level warn "${argv[@]:1}" \
    >"$WORK/$name.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_ready "$port" "$name" "$pid"
  NAMES+=("$name") PORTS+=("$port") CPIDS+=("$pid")
done

redis_io() { # Redis's commands run and socket reads so far
  redis-cli -p "$REDIS_PORT" info stats |
    awk -F: '/^total_(commands|reads)_processed:/ { sub(/\r$/, "", $2); printf "%s ", $2 }'
}
run() { # PORT SECONDS SEED: prints the requests/s corral-load reports
  "$LOAD" --addr "127.0.0.1:$1" -c 50 -P "$DEPTH" -k "$KEYS" --dist "$DIST" \
    --get-ratio "$RATIO" -d 64 --duration "$2" --seed "$3" 2>&1 |
    grep -oE '[0-9.]+ req/s' | head -1 | cut -d' ' -f1
}
# The warm-up goes round the targets in slices of at most WARM_SLICE s, so that their caches
# are about the same age when measured: entries live at most max_age_ms, and a cache warmed
# 25 s before another's refills while the other does not. Each slice reads keys of its own.
WARM_SLICE=5
left=$WARM slice=0
while [ "$left" -gt 0 ]; do
  s=$((left < WARM_SLICE ? left : WARM_SLICE))
  slice=$((slice + 1))
  for i in "${!NAMES[@]}"; do run "${PORTS[$i]}" "$s" "$((1000 + slice))" >/dev/null; done
  left=$((left - s))
done
echo "corral-load -c 50 -P $DEPTH -k $KEYS --dist $DIST --get-ratio $RATIO, $SECS s rounds after $WARM s" \
  "${PIN:+(pinned: corral-load on CPUs ${PIN%%:*}, servers on ${PIN#*:})}"
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!NAMES[@]}"; do
    read -r u0 s0 <<< "$(cpu_split "${CPIDS[$i]}")"
    read -r ru0 rs0 <<< "$(cpu_split "$REDIS_PID")"
    read -r c0 d0 <<< "$(redis_io)"
    rps=$(run "${PORTS[$i]}" "$SECS" "$r")
    read -r u1 s1 <<< "$(cpu_split "${CPIDS[$i]}")"
    read -r ru1 rs1 <<< "$(cpu_split "$REDIS_PID")"
    read -r c1 d1 <<< "$(redis_io)"
    awk -v n="${NAMES[$i]}" -v r="$r" -v rps="${rps:-0}" -v u=$((u1 - u0)) -v k=$((s1 - s0)) \
      -v rc=$((ru1 + rs1 - ru0 - rs0)) -v s="$SECS" -v t="$CLK_TCK" \
      -v cmds=$((c1 - c0)) -v reads=$((d1 - d0)) \
      'BEGIN { per = (rps > 0) ? 1e6 / t / (rps * s) : 0
               printf "%-12s round %d  %10.0f req/s  corral %.3f us/req (user %.3f, system %.3f)  redis %.3f (%.1f commands/read)\n",
                 n, r, rps, (u + k) * per, u * per, k * per, rc * per, (reads > 0) ? cmds / reads : 0 }'
  done
done
