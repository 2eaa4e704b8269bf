#!/usr/bin/env bash
# How long a pipeline of large values takes to reach its client, directly from Redis and
# through corral builds or settings, and corral's peak memory. One redis-server holds N keys
# of SIZE bytes; for each target, ROUNDS times, a client sends N GETs of them in one write and
# reads the replies as fast as it can: the time to the first reply byte and to the last, and
# once all rounds ran, corral's peak resident memory (VmHWM). With --cluster, a 3-master Redis
# Cluster holds them and each corral runs with --cluster in front of it; the direct row is
# then measured only with --tag (every key in one hash tag, so on one master: that master).
#
# Usage: scripts/large-pipeline.sh [-n N] [-s SIZE] [-r ROUNDS] [--cluster] [--tag T] NAME=BIN[,FLAG...] ...
#   e.g. scripts/large-pipeline.sh new=target/release/corral off=target/release/corral,--no-cache
set -euo pipefail
cd "$(dirname "$0")/.."

N=400 SIZE=1048576 ROUNDS=3 CLUSTER=0 TAG=
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N=$2; shift 2 ;;
    -s) SIZE=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    --cluster) CLUSTER=1; shift ;;
    --tag) TAG=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *=*) TARGETS+=("$1"); shift ;;
    *) echo "large-pipeline.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v redis-server >/dev/null || { echo "large-pipeline.sh: needs redis-server" >&2; exit 1; }

WORK=$(mktemp -d /tmp/corral-large.XXXXXX)
PIDS=()
# shellcheck source=scripts/procs.sh
. scripts/procs.sh

# upstream_flags: how a corral reaches the Redis (or the cluster) of this run.
if [ "$CLUSTER" = 1 ]; then
  NODES=()
  for i in 1 2 3; do
    # A node's bus listens on its port + 10000.
    port=$(free_port)
    while [ "$port" -gt 55535 ]; do port=$(free_port); done
    mkdir -p "$WORK/node$port"
    (cd "$WORK/node$port" && exec redis-server --port "$port" --cluster-enabled yes \
      --cluster-config-file nodes.conf --save '' --appendonly no) >"$WORK/node$port.log" 2>&1 &
    PIDS+=($!)
    wait_ready "$port" "node$port" $!
    NODES+=("$port")
  done
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODES[@]}") --cluster-replicas 0 \
    --cluster-yes >"$WORK/create.log" 2>&1
  for i in $(seq 1 100); do
    redis-cli -p "${NODES[0]}" cluster info | grep -q cluster_state:ok && break
    sleep 0.1
  done
  upstream_flags=(--cluster "redis://127.0.0.1:${NODES[0]}")
  REDIS_PORT=
else
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
  PIDS+=($!)
  wait_ready "$REDIS_PORT" redis $!
  upstream_flags=(--upstream "redis://127.0.0.1:$REDIS_PORT")
fi
PREFIX=${TAG:+\{$TAG\}}

# pipeline.py PORT N SIZE PREFIX [fill]: fills the keys, or reads them back in one pipeline.
cat >"$WORK/pipeline.py" <<'EOF'
import socket, sys, time
port, n, size, prefix = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
keys = [prefix + b"large:%d" % i for i in range(n)]
def cmd(*args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
if len(sys.argv) > 5:
    value = bytes(97 + i % 26 for i in range(size))
    for k in keys:
        s.sendall(cmd(b"SET", k, value))
        if not s.recv(64).startswith(b"+OK"):
            sys.exit("SET failed")
    sys.exit(0)
need = n * (len(b"$%d\r\n" % size) + size + 2)
buf = bytearray(4 << 20)
t0 = time.monotonic()
s.sendall(b"".join(cmd(b"GET", k) for k in keys))
got, first = 0, None
while got < need:
    r = s.recv_into(buf)
    if r == 0:
        sys.exit("connection closed after %d bytes" % got)
    if first is None:
        first = time.monotonic() - t0
    got += r
print("%.3f s to the first byte, %.3f s to the last (%d bytes)" % (first, time.monotonic() - t0, got))
EOF
# fill_and_direct PORT: fills the keys through PORT, then runs the direct rounds (in cluster
# mode only with --tag, against the master that then holds all the keys).
fill_and_direct() {
  local p r
  python3 "$WORK/pipeline.py" "$1" "$N" "$SIZE" "$PREFIX" fill
  if [ "$CLUSTER" = 1 ] && [ -n "$TAG" ]; then
    for p in "${NODES[@]}"; do
      [ "$(redis-cli -p "$p" dbsize)" = "$N" ] && REDIS_PORT=$p
    done
  fi
  echo "$N GETs of $SIZE bytes in one write, $ROUNDS rounds per target"
  [ -n "$REDIS_PORT" ] || return 0
  for r in $(seq 1 "$ROUNDS"); do
    printf '%-12s ' direct
    python3 "$WORK/pipeline.py" "$REDIS_PORT" "$N" "$SIZE" "$PREFIX"
  done
}
FILLED=0
if [ "$CLUSTER" = 0 ]; then fill_and_direct "$REDIS_PORT"; FILLED=1; fi
for t in "${TARGETS[@]}"; do
  name=${t%%=*}
  IFS=, read -ra argv <<< "${t#*=}"
  port=$(free_port)
  "${argv[0]}" --listen "127.0.0.1:$port" "${upstream_flags[@]}" \
    --log-level warn "${argv[@]:1}" >"$WORK/$name.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_ready "$port" "$name" "$pid"
  if [ "$FILLED" = 0 ]; then fill_and_direct "$port"; FILLED=1; fi
  for r in $(seq 1 "$ROUNDS"); do
    printf '%-12s ' "$name"
    python3 "$WORK/pipeline.py" "$port" "$N" "$SIZE" "$PREFIX"
  done
  printf '%-12s peak memory %s\n' "$name" "$(grep VmHWM "/proc/$pid/status" | tr -s ' \t' ' ' | cut -d' ' -f2-)"
  kill "$pid"
done
