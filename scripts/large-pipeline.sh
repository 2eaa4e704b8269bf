#!/usr/bin/env bash
# How long a pipeline of large values takes to reach its client, directly from Redis and
# through corral builds or settings, and corral's peak memory. One redis-server holds N keys
# of SIZE bytes; for each target, ROUNDS times, a client sends N GETs of them in one write and
# reads the replies as fast as it can: the time to the first reply byte and to the last, and
# once all rounds ran, corral's peak resident memory (VmHWM).
#
# Usage: scripts/large-pipeline.sh [-n N] [-s SIZE] [-r ROUNDS] NAME=BIN[,FLAG...] ...
#   e.g. scripts/large-pipeline.sh new=target/release/corral off=target/release/corral,--no-cache
set -euo pipefail
cd "$(dirname "$0")/.."

N=400 SIZE=1048576 ROUNDS=3
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N=$2; shift 2 ;;
    -s) SIZE=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *=*) TARGETS+=("$1"); shift ;;
    *) echo "large-pipeline.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v redis-server >/dev/null || { echo "large-pipeline.sh: needs redis-server" >&2; exit 1; }

WORK=$(mktemp -d /tmp/corral-large.XXXXXX)
PIDS=()
# shellcheck source=scripts/procs.sh
. scripts/procs.sh

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_ready "$REDIS_PORT" redis $!

# pipeline.py PORT N SIZE [fill]: fills the keys, or reads them back in one pipeline.
cat >"$WORK/pipeline.py" <<'EOF'
import socket, sys, time
port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
keys = [b"large:%d" % i for i in range(n)]
def cmd(*args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
if len(sys.argv) > 4:
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
python3 "$WORK/pipeline.py" "$REDIS_PORT" "$N" "$SIZE" fill

echo "$N GETs of $SIZE bytes in one write, $ROUNDS rounds per target"
for r in $(seq 1 "$ROUNDS"); do
  printf '%-12s ' direct
  python3 "$WORK/pipeline.py" "$REDIS_PORT" "$N" "$SIZE"
done
for t in "${TARGETS[@]}"; do
  name=${t%%=*}
  IFS=, read -ra argv <<< "${t#*=}"
  port=$(free_port)
  "${argv[0]}" --listen "127.0.0.1:$port" --upstream "redis://127.0.0.1:$REDIS_PORT" \
    --log-level warn "${argv[@]:1}" >"$WORK/$name.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_ready "$port" "$name" "$pid"
  for r in $(seq 1 "$ROUNDS"); do
    printf '%-12s ' "$name"
    python3 "$WORK/pipeline.py" "$port" "$N" "$SIZE"
  done
  printf '%-12s peak memory %s\n' "$name" "$(grep VmHWM "/proc/$pid/status" | tr -s ' \t' ' ' | cut -d' ' -f2-)"
  kill "$pid"
done
