#!/usr/bin/env bash
# Counts the instructions corral runs per client request under a corral-load workload, with
# callgrind: a figure that, unlike time on a shared machine, does not move between runs of
# one build, so two builds (or the cache on and off) can be compared one run each.
#
# It starts its own redis-server with K keys, corral under callgrind (instrumentation off),
# warms up for 5 s, counts the instructions of D seconds of load, and prints the total per
# request (requests as corral-load counted them) and corral's functions by their own
# instructions per request. Under callgrind corral runs some 50 times slower, so a round holds
# other requests than at full speed: compare builds with this, and time with scripts/bench.sh.
#
# Usage: scripts/instructions.sh [--no-cache] [--config FILE] [--bin BIN] [--dist zipf|uniform]
#          [--get-ratio R] [-P N] [-k KEYS] [-d SECONDS] [--top N] [--out FILE]
#          [--keep CALLGRIND_FILE]   (the raw profile, for callgrind_annotate --auto=yes)
# Needs valgrind (apt-get install valgrind), redis-server, redis-cli, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/corral LOAD=target/release/corral-load
FLAGS=() DIST=zipf RATIO=1 PIPE=16 KEYS=1000000 SECS=10 TOP=30 OUT="" KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-cache) FLAGS+=(--no-cache) ;;
    --config) FLAGS+=(--config "$2"); shift ;;
    --bin) BIN=$2; shift ;;
    --dist) DIST=$2; shift ;;
    --get-ratio) RATIO=$2; shift ;;
    -P) PIPE=$2; shift ;;
    -k) KEYS=$2; shift ;;
    -d) SECS=$2; shift ;;
    --top) TOP=$2; shift ;;
    --out) OUT=$2; shift ;;
    --keep) KEEP=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in valgrind callgrind_control callgrind_annotate redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
[ -x "$BIN" ] && [ -x "$LOAD" ] || cargo build --release --quiet
WORK=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(free_port) CP=$(free_port)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --logfile "$WORK/redis.log" &
PIDS+=($!)
until redis-cli -p "$RP" ping >/dev/null 2>&1; do sleep 0.1; done
"$LOAD" --addr "127.0.0.1:$RP" --fill -k "$KEYS" >/dev/null 2>&1
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg.out" \
  "$BIN" "${FLAGS[@]}" --listen "127.0.0.1:$CP" --upstream "redis://127.0.0.1:$RP" \
  --log-level warn 2>"$WORK/valgrind.log" &
CPID=$!
PIDS+=($CPID)
until redis-cli -p "$CP" ping >/dev/null 2>&1; do sleep 0.2; done
load() {
  "$LOAD" --addr "127.0.0.1:$CP" --dist "$DIST" --get-ratio "$RATIO" -P "$PIPE" -c 50 \
    -k "$KEYS" --duration "$1" --seed "$2" --csv 2>/dev/null | tail -1
}
load 5 2 >/dev/null
callgrind_control -i on "$CPID" >/dev/null
CSV=$(load "$SECS" 3)
callgrind_control -i off "$CPID" >/dev/null
callgrind_control -d "$CPID" >/dev/null
sleep 1
[ -n "$KEEP" ] && cp "$WORK/cg.out.1" "$KEEP"
python3 - "$WORK/cg.out.1" "$CSV" "$TOP" "$DIST" "$RATIO" "$PIPE" "${FLAGS[*]:-cache on}" <<'PY' | tee ${OUT:+"$OUT"}
import collections, re, subprocess, sys
out, csv, top = sys.argv[1], sys.argv[2], int(sys.argv[3])
requests = int(csv.split(',')[0])
ann = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", "--tree=none", out],
                     capture_output=True, text=True, check=True).stdout
total = 0
by_fn = collections.Counter()
for line in ann.splitlines():
    m = re.match(r'\s*([\d,]+) \([^)]*\)\s+(.*)', line)
    if not m:
        continue
    ir = int(m.group(1).replace(',', ''))
    if 'PROGRAM TOTALS' in m.group(2):
        total = ir
        continue
    fn = re.sub(r' \[.*\]$', '', m.group(2)).split(':', 1)[-1]
    if re.search(r'\([\d,]+x\)$', fn) or not re.match(r'[A-Za-z_<]', fn) \
            or fn == 'events annotated':
        continue  # a call's cost (already in its callee's own), or a line, not a function
    if re.search(r"\([\d,]+x\)$", fn):
        continue
    by_fn[re.sub(r'<impl [^>]*>', '', fn)] += ir
print(f"corral ({sys.argv[7]}), corral-load --dist {sys.argv[4]} --get-ratio {sys.argv[5]} "
      f"-P {sys.argv[6]}: {requests} requests, {total / requests:.0f} instructions per request")
for fn, ir in by_fn.most_common(top):
    print(f"{ir / requests:8.0f}  {fn[:110]}")
PY
