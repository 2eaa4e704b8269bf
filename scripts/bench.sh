#!/usr/bin/env bash
# End-to-end benchmark: corral (--no-cache) against direct Redis and against nutcracker
# (twemproxy), all started here on free 127.0.0.1 ports and stopped on exit.
#
# Runs are interleaved (each round: direct, nutcracker, corral) so that the noise of a shared
# machine hits every target alike; each figure is the median over the rounds. For every run it
# records throughput and p99 latency (from the client; p99.9 too from corral-load, which
# shows a stall of one thread that p99 hides), the CPU time per request of the
# proxy and of redis-server (utime+stime from /proc/PID/stat around the run), and the share
# of the machine left idle meanwhile (/proc/stat): a run with much idle time is bound by the
# latency of its round trips rather than by CPU, and its throughput ratios say less about
# the CPU each target spends.
#
# Scenarios, one function each (scenario_NAME), chosen with --scenarios:
#   p1, p16  redis-benchmark -c 50 -n N -t set / -t get at pipeline depth 1 / 16
#   load     corral-load: Zipf(0.99) keys over a preloaded key space, 90% GET, pipeline 16
#            (also through corral with its cache on: target "cached")
#   hot      one hot key: redis-benchmark GET at -P 1 and -P 16, direct vs corral with its
#            cache on ("cached"), and the share of those GETs that reached Redis; then
#            corral-load on one key ("LOAD") for --load-seconds, the same targets
#   skew     does the cache pay for itself: direct vs corral --no-cache ("corral") vs corral
#            with its cache on ("cached"), LOAD_KEYS keys of 64 bytes preloaded.
#            corral-load: Zipf(0.99) GET, Zipf 90/10 GET/SET, uniform GET (cold keys), each
#            at -P 16 and -P 1. redis-benchmark: GET and SET over -r LOAD_KEYS random keys
#            (cold), -P 16 and -P 1. Each workload first runs --warmup S seconds (default 3,
#            unmeasured) on the cache-on targets; "zsw-p16" is the 90/10 mix measured right
#            after Zipf GETs instead, the cache switching over from one to the other.
#   settled  Zipf(0.99) GET over LOAD_KEYS keys once the cache has settled: each cache-on
#            target first runs --settle S seconds (default 25, unmeasured) of Zipf GETs -P 16,
#            then it is measured at -P 16 and at -P 1 ("zset-p16", "zset-p1"), each target
#            right after its own warm-up (a long-running proxy's state, which the 3 s warm-up
#            of "skew" does not reach: the sketch's long window takes 20-25 s to fill)
#   warm     a warm set the cache holds whole: corral-load uniform GET over WARM_KEYS (100,000)
#            keys, -P 16 and -P 1, direct vs --no-cache vs cache on; each round first warms
#            each cache-on target for 10 s (unmeasured), as a long-running proxy would be
#   cluster  corral --cluster in front of a 3-master Redis Cluster (started here), --no-cache
#            ("cluster") and with its cache on ("clcached"), against the standalone
#            redis-server and standalone corral: redis-benchmark -c 50 -t set,get -r 100000
#            (keys key:NNN spread over every slot) at -P 1 (-n N) and -P 16 (--n16)
#   tls      TLS on both sides (not in the default list; --scenarios tls): one redis-server
#            with a plain and a TLS port (certificates made here with openssl), redis-benchmark
#            -c 50 -t set,get at -P 1 and -P 16 against Redis plain ("rplain"), Redis TLS
#            ("rtls", redis-benchmark --tls), corral plain to plain ("cplain", --no-cache) and
#            corral TLS listener to rediss:// ("ctls", --no-cache)
# Key sequences: corral-load's keys follow its --seed. A run on a cache-on target never
# repeats the sequence of a run before it (warm-up or measured, this workload or another):
# replayed, the warm-up's keys are what the measured run reads first, and a cache holds them
# (Zipf GETs -P 16: 85% hits against 83-84% on fresh keys). new_seed gives each run its own;
# the targets of one round share one, so they read the same keys.
# To add one (say a cache-on hot-key run), start what it needs in a start_* function, register
# the target with add_target, and write scenario_NAME calling record_rb or measure.
#
# --baseline BIN adds a second corral build to every scenario, as targets "base" (--no-cache)
# and "basecached" (cache on), run in the same rounds, with before/after ratios and CPU.
#
# --pin CLIENT_CPUS:SERVER_CPUS (taskset lists, say 0:1) runs the load generators (this
# script and everything it runs but the servers) on CLIENT_CPUS, and every redis-server,
# nutcracker and corral on SERVER_CPUS: a client host and a server host whose CPU the proxy
# shares with Redis. Unpinned, the scheduler places the three processes on the cores as it
# likes, and which two share a core moves throughput by up to 40% between runs of one build
# (see docs/BENCHMARKS.md "Where the processes run").
#
# Usage: scripts/bench.sh [-n N] [--n16 N] [-r ROUNDS] [--quick] [--scenarios "p1 p16 load"]
#                         [--load-seconds S] [--load-keys K] [--out FILE] [--no-build]
#                         [--baseline BIN] [--warmup S] [--settle S] [--pin C:S]
set -euo pipefail
cd "$(dirname "$0")/.."

N=200000
N16=""
ROUNDS=3
SCENARIOS="p1 p16 hot load skew settled warm cluster"
LOAD_SECONDS=5
WARMUP=3
SETTLE=25
LOAD_KEYS=1000000
WARM_KEYS=100000
CLIENTS=50
OUT=""
BUILD=1
BASELINE=""
PIN=""
# Upper bound for any single client run, so a wedged target cannot hang the script.
RUN_TIMEOUT=300

# The header comment above is the help text.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

while [ $# -gt 0 ]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    --n16) N16="$2"; shift 2 ;;
    -r|--rounds) ROUNDS="$2"; shift 2 ;;
    --quick) N=50000; ROUNDS=1; LOAD_SECONDS=2; LOAD_KEYS=100000; WARMUP=1; shift ;;
    --scenarios) SCENARIOS="$2"; shift 2 ;;
    --load-seconds) LOAD_SECONDS="$2"; shift 2 ;;
    --load-keys) LOAD_KEYS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --settle) SETTLE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --baseline) BASELINE="$2"; shift 2 ;;
    --pin) PIN="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

# -P 16 runs are ~15x faster than -P 1 runs; --n16 lets them last long enough to be stable
# (and to span enough 10 ms CPU ticks).
N16=${N16:-$N}

for cmd in redis-server redis-cli redis-benchmark nutcracker python3 timeout; do
  command -v "$cmd" >/dev/null || { echo "bench.sh: $cmd not found (scripts/deps.sh --bench)" >&2; exit 1; }
done

if [ "$BUILD" = 1 ]; then
  cargo build --release --bins --quiet
fi
CORRAL=target/release/corral
LOAD=target/release/corral-load
[ -x "$CORRAL" ] && [ -x "$LOAD" ] || { echo "bench.sh: build corral first" >&2; exit 1; }
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || { echo "bench.sh: no baseline binary $BASELINE" >&2; exit 1; }
# Extra targets of every scenario: the baseline build, without and with its cache.
BASE_OFF=${BASELINE:+base}
BASE_ON=${BASELINE:+basecached}

WORK=$(mktemp -d /tmp/corral-bench.XXXXXX)
RESULTS="$WORK/results.tsv"
PIDS=()

# shellcheck source=scripts/procs.sh
. scripts/procs.sh
# Servers start under ON_SERVER; the clients inherit this script's CPUs.
pin_placement "$PIN"

# Targets: name -> port and the pid of the proxy in front of Redis ("" when direct).
# REDIS_PIDS_OF: the redis-server pids behind a target, when not the standalone one.
declare -A PORT PROXY_PID REDIS_PIDS_OF
TARGETS=()
add_target() { TARGETS+=("$1"); PORT[$1]=$2; PROXY_PID[$1]=$3; }

# redis_ticks TARGET: CPU ticks of every redis-server behind TARGET.
redis_ticks() {
  local pid sum=0
  for pid in ${REDIS_PIDS_OF[$1]:-$REDIS_PID}; do sum=$(( sum + $(cpu_ticks "$pid") )); done
  echo "$sum"
}

# The machine's idle and total ticks so far ("idle total", /proc/stat): a run that leaves
# much of it idle is bound by its round trips' latency, not by CPU.
machine_ticks() {
  local _cpu user nice system idle iowait irq softirq steal
  read -r _cpu user nice system idle iowait irq softirq steal _ </proc/stat
  echo "$(( idle + iowait )) $(( user + nice + system + idle + iowait + irq + softirq + steal ))"
}

start_redis() {
  REDIS_PORT=$(free_port)
  "${ON_SERVER[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
    --appendonly no --daemonize no --logfile "$WORK/redis.log" &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  wait_ready "$REDIS_PORT" redis "$REDIS_PID"
  add_target direct "$REDIS_PORT" ""
}

start_nutcracker() {
  local port stats
  port=$(free_port)
  stats=$(free_port)
  cat >"$WORK/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:$port
  hash: fnv1a_64
  distribution: ketama
  redis: true
  preconnect: true
  auto_eject_hosts: false
  server_connections: 1
  servers:
   - 127.0.0.1:$REDIS_PORT:1
EOF
  "${ON_SERVER[@]}" nutcracker -c "$WORK/nutcracker.yml" -s "$stats" -a 127.0.0.1 \
    -o "$WORK/nutcracker.log" &
  local pid=$!
  PIDS+=("$pid")
  wait_ready "$port" nutcracker "$pid"
  add_target nutcracker "$port" "$pid"
}

# start_corral TARGET BIN [FLAGS...]: a corral in front of the standalone Redis.
start_corral() {
  local target=$1 bin=$2 port
  shift 2
  port=$(free_port)
  "${ON_SERVER[@]}" "$bin" "$@" --listen "127.0.0.1:$port" \
    --upstream "redis://127.0.0.1:$REDIS_PORT" --log-level warn >"$WORK/$target.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_ready "$port" "$target" "$pid"
  add_target "$target" "$port" "$pid"
}

# A 3-master Redis Cluster (no replicas) on free ports, each node with its own bus port.

start_cluster() {
  local i port bus pid addrs=() ok
  CLUSTER_PIDS=""
  CLUSTER_SEEDS=""
  for i in 1 2 3; do
    port=$(free_port)
    bus=$(free_port)
    mkdir -p "$WORK/node$i"
    "${ON_SERVER[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --daemonize no --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" \
      --cluster-node-timeout 5000 --dir "$WORK/node$i" --logfile "$WORK/node$i.log" &
    pid=$!
    PIDS+=("$pid")
    wait_ready "$port" "node$i" "$pid"
    CLUSTER_PIDS="$CLUSTER_PIDS $pid"
    CLUSTER_SEEDS="${CLUSTER_SEEDS:+$CLUSTER_SEEDS,}redis://127.0.0.1:$port"
    addrs+=("127.0.0.1:$port")
  done
  timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
    >"$WORK/cluster-create.log" 2>&1 </dev/null || {
    echo "bench.sh: redis-cli --cluster create failed:" >&2; cat "$WORK/cluster-create.log" >&2; exit 1
  }
  for i in $(seq 1 300); do
    ok=1
    for port in "${addrs[@]#127.0.0.1:}"; do
      timeout 2 redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || ok=0
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  echo "bench.sh: the cluster never reached cluster_state:ok" >&2; exit 1
}

# start_corral_cluster NAME [FLAG...]: corral --cluster in front of the cluster; ready once it
# knows every slot.
start_corral_cluster() {
  local name=$1 port i
  shift
  port=$(free_port)
  "${ON_SERVER[@]}" "$CORRAL" "$@" --listen "127.0.0.1:$port" --cluster "$CLUSTER_SEEDS" \
    --log-level warn >"$WORK/corral-$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_ready "$port" "corral-$name" "$pid"
  for i in $(seq 1 100); do
    timeout 2 redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
    [ "$i" = 100 ] && { echo "bench.sh: corral never saw the cluster as ok" >&2; exit 1; }
    sleep 0.1
  done
  add_target "$name" "$port" "$pid"
  REDIS_PIDS_OF[$name]=$CLUSTER_PIDS
}

# measure SCENARIO TEST TARGET ROUND PARSER -- CMD...: runs CMD with the CPU counters of
# redis-server, of the target's proxy and of the machine read around it; PARSER (a function
# and its arguments, word-split) turns CMD's output into "requests rps p99_ms p999_ms"
# (p999_ms "-" where the client gives none); appends one line to $RESULTS.
measure() {
  local scenario=$1 test=$2 target=$3 round=$4 parser=$5
  shift 6
  local ppid=${PROXY_PID[$target]} out r0 r1 p0=0 p1=0 requests rps p99 p999 proxy_us redis_us
  local m0 m1 idle_pct
  r0=$(redis_ticks "$target")
  [ -n "$ppid" ] && p0=$(cpu_ticks "$ppid")
  m0=$(machine_ticks)
  out=$(timeout "$RUN_TIMEOUT" "$@" 2>"$WORK/client.err") || {
    echo "bench.sh: $scenario $test on $target failed:" >&2; cat "$WORK/client.err" >&2; exit 1
  }
  m1=$(machine_ticks)
  r1=$(redis_ticks "$target")
  [ -n "$ppid" ] && p1=$(cpu_ticks "$ppid")
  # shellcheck disable=SC2086
  read -r requests rps p99 p999 < <(printf '%s\n' "$out" | $parser) || true
  [ -n "${p99:-}" ] || { echo "bench.sh: no result from: $*" >&2; printf '%s\n' "$out" >&2; exit 1; }
  # µs per request = ticks * 1e6 / CLK_TCK / requests
  redis_us=$(python3 -c "print(f'{($r1-$r0)*1e6/$CLK_TCK/$requests:.3f}')")
  proxy_us=-
  [ -n "$ppid" ] && proxy_us=$(python3 -c "print(f'{($p1-$p0)*1e6/$CLK_TCK/$requests:.3f}')")
  idle_pct=$(python3 -c "i0, t0, i1, t1 = map(int, '$m0 $m1'.split())
print(f'{100 * (i1 - i0) / max(t1 - t0, 1):.0f}')")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$test" "$target" "$round" \
    "$rps" "$p99" "$proxy_us" "$redis_us" "$idle_pct" "${p999:--}" >>"$RESULTS"
  printf '  %-5s %-4s %-11s round %s: %10.0f req/s  p99 %6s ms  p99.9 %6s ms  proxy %6s us/req  redis %6s us/req  idle %3s%%\n' \
    "$scenario" "$test" "$target" "$round" "$rps" "$p99" "${p999:--}" "$proxy_us" "$redis_us" \
    "$idle_pct"
}

# redis-benchmark --csv: "test","rps","avg","min","p50","p95","p99","max".
# The request count is the one given to redis-benchmark (-n), passed in $1.
parse_rb() { awk -F'"' -v n="$1" 'NR > 1 && NF > 14 { print n, $4, $14, "-"; exit }'; }
# corral-load --csv: ops,secs,rps,p50_ms,p99_ms,p999_ms,...
parse_load() { awk -F, 'NR == 2 { print $1, $3, $5, $6 }'; }

# record_rb SCENARIO PIPELINE REQUESTS ROUND: one redis-benchmark run per test per target.
record_rb() {
  local scenario=$1 pipe=$2 n=$3 round=$4 test target
  for test in set get; do
    for target in direct nutcracker corral $BASE_OFF; do
      measure "$scenario" "${test^^}" "$target" "$round" "parse_rb $n" -- \
        redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" -c "$CLIENTS" -n "$n" \
        -t "$test" -P "$pipe" --csv
    done
  done
}

scenario_p1() {
  local r
  for r in $(seq 1 "$ROUNDS"); do record_rb p1 1 "$N" "$r"; done
}

scenario_p16() {
  local r
  for r in $(seq 1 "$ROUNDS"); do record_rb p16 16 "$N16" "$r"; done
}

# The cluster against one standalone Redis (direct) and standalone corral, keys spread over
# every slot (-r), each round running every target back to back.
scenario_cluster() {
  local r pipe n test target
  for r in $(seq 1 "$ROUNDS"); do
    for pipe in 1 16; do
      n=$N
      [ "$pipe" = 16 ] && n=$N16
      for test in set get; do
        for target in direct corral cluster clcached; do
          measure "cl-p$pipe" "${test^^}" "$target" "$r" "parse_rb $n" -- \
            redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" -c "$CLIENTS" -n "$n" \
            -r 100000 -t "$test" -P "$pipe" --csv
        done
      done
    done
  done
  # The SETs went through corral to every master (redis-benchmark counts error replies as
  # answers, so check where the keys are).
  local port total=0 keys
  for port in ${CLUSTER_SEEDS//,/ }; do
    port=${port##*:}
    keys=$(redis-cli -p "$port" dbsize)
    [ "$keys" -gt 0 ] || { echo "bench.sh: cluster master :$port holds no key" >&2; exit 1; }
    total=$(( total + keys ))
  done
  echo "  cluster: $total keys over the masters; DBSIZE through corral:" \
    "$(redis-cli -p "${PORT[cluster]}" dbsize), through standalone: $(redis-cli -p "$REDIS_PORT" dbsize)"
}

# A key sequence no run before has read: the next --seed, in SEED.
SEED=0
new_seed() { SEED=$((SEED + 1)); }

# Zipf(0.99) over LOAD_KEYS preloaded keys, 90% GET / 10% SET, 50 connections x pipeline 16.
scenario_load() {
  local r target
  timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k "$LOAD_KEYS" -c 8
  for r in $(seq 1 "$ROUNDS"); do
    new_seed
    for target in direct nutcracker corral cached $BASE_OFF $BASE_ON; do
      measure load MIX "$target" "$r" parse_load -- \
        "$LOAD" --addr "127.0.0.1:${PORT[$target]}" -c "$CLIENTS" -P 16 -k "$LOAD_KEYS" \
        --dist zipf --zipf-s 0.99 --get-ratio 0.9 --duration "$LOAD_SECONDS" --seed "$SEED" --csv
    done
  done
}

# The command of a skew run (its variables are scenario_skew's), in CMD: corral-load on
# TARGET for SECONDS with the keys of SEED, or redis-benchmark on TARGET for N requests
# (its -r keys are drawn afresh by each run).
skew_load() {
  CMD=("$LOAD" --addr "127.0.0.1:${PORT[$1]}" -c "$CLIENTS" -P "$pipe" -k "$LOAD_KEYS"
    --dist "$dist" --zipf-s 0.99 --get-ratio "$ratio" --duration "$2" --seed "$SEED" --csv)
}
skew_rb() {
  CMD=(redis-benchmark -h 127.0.0.1 -p "${PORT[$1]}" -c "$CLIENTS" -n "$2"
    -r "$LOAD_KEYS" -d 64 -t "$test" -P "$pipe" --csv)
}

# The cache's workloads: every target of a round back to back (direct, corral, cached).
# Each workload first runs WARMUP seconds, unmeasured, on the cache-on targets: a cache holds
# what the workload before left, and a run right after another workload measures the switch
# from one to the other. That switch is measured on its own once per round: the 90/10 mix
# right after Zipf GETs ("zsw-p16"), on every target, before the mix's warm-up.
scenario_skew() {
  local r target pipe n name dist ratio test
  timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k "$LOAD_KEYS" -c 8
  for r in $(seq 1 "$ROUNDS"); do
    for pipe in 16 1; do
      for name in zget:zipf:1 zmix:zipf:0.9 uget:uniform:1; do
        IFS=: read -r name dist ratio <<<"$name"
        if [ "$name" = zmix ] && [ "$pipe" = 16 ]; then
          new_seed
          for target in direct corral cached $BASE_OFF $BASE_ON; do
            skew_load "$target" "$LOAD_SECONDS"
            measure "zsw-p$pipe" LOAD "$target" "$r" parse_load -- "${CMD[@]}"
          done
        fi
        new_seed
        for target in cached $BASE_ON; do
          skew_load "$target" "$WARMUP"
          timeout "$RUN_TIMEOUT" "${CMD[@]}" >/dev/null
        done
        new_seed
        for target in direct corral cached $BASE_OFF $BASE_ON; do
          skew_load "$target" "$LOAD_SECONDS"
          measure "$name-p$pipe" LOAD "$target" "$r" parse_load -- "${CMD[@]}"
        done
      done
      n=$N
      [ "$pipe" = 16 ] && n=$N16
      for test in get set; do
        for target in cached $BASE_ON; do
          skew_rb "$target" $((n / 2))
          timeout "$RUN_TIMEOUT" "${CMD[@]}" >/dev/null
        done
        for target in direct corral cached $BASE_OFF $BASE_ON; do
          skew_rb "$target" "$n"
          measure "rb$test-p$pipe" "${test^^}" "$target" "$r" "parse_rb $n" -- "${CMD[@]}"
        done
      done
    done
  done
}

# Zipf GETs on settled caches: each cache-on target warmed SETTLE s right before it is
# measured (entries live max_age_ms, 60 s: a warm-up long before would have expired).
scenario_settled() {
  local r target pipe
  timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k "$LOAD_KEYS" -c 8
  local warm_seed p16_seed p1_seed seed
  for r in $(seq 1 "$ROUNDS"); do
    new_seed
    warm_seed=$SEED
    new_seed
    p16_seed=$SEED
    new_seed
    p1_seed=$SEED
    for target in direct corral cached $BASE_OFF $BASE_ON; do
      if [ "$target" = cached ] || [ "$target" = basecached ]; then
        timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:${PORT[$target]}" -c "$CLIENTS" -P 16 \
          -k "$LOAD_KEYS" --dist zipf --zipf-s 0.99 --get-ratio 1 --duration "$SETTLE" \
          --seed "$warm_seed" >/dev/null
      fi
      for pipe in 16 1; do
        seed=$p16_seed
        [ "$pipe" = 1 ] && seed=$p1_seed
        measure "zset-p$pipe" LOAD "$target" "$r" parse_load -- \
          "$LOAD" --addr "127.0.0.1:${PORT[$target]}" -c "$CLIENTS" -P "$pipe" -k "$LOAD_KEYS" \
          --dist zipf --zipf-s 0.99 --get-ratio 1 --duration "$LOAD_SECONDS" --seed "$seed" --csv
      done
    done
  done
}

# A warm set: uniform GETs over WARM_KEYS keys, all of which the cache can hold.
scenario_warm() {
  local r target pipe
  timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k "$WARM_KEYS" -c 8
  for r in $(seq 1 "$ROUNDS"); do
    # Entries live at most max_age_ms (60 s): each round warms the caches again first.
    new_seed
    for target in cached $BASE_ON; do
      timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:${PORT[$target]}" -c "$CLIENTS" -P 16 \
        -k "$WARM_KEYS" --dist uniform --get-ratio 1 --duration 10 --seed "$SEED" >/dev/null
    done
    for pipe in 16 1; do
      new_seed
      for target in direct corral cached $BASE_OFF $BASE_ON; do
        measure "wget-p$pipe" LOAD "$target" "$r" parse_load -- \
          "$LOAD" --addr "127.0.0.1:${PORT[$target]}" -c "$CLIENTS" -P "$pipe" -k "$WARM_KEYS" \
          --dist uniform --get-ratio 1 --duration "$LOAD_SECONDS" --seed "$SEED" --csv
      done
    done
  done
}

# GETs Redis has executed so far (inside MULTI/EXEC included).
redis_gets() {
  redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
    awk -F'[=,:]' '/^cmdstat_get:/ { print $3; exit } END { if (NR == 0) print 0 }'
}

# One hot key (redis-benchmark's literal key:__rand_int__ without -r), GET only.
scenario_hot() {
  local r pipe n target before after
  redis-cli -p "$REDIS_PORT" set key:__rand_int__ xxx >/dev/null
  timeout "$RUN_TIMEOUT" "$LOAD" --addr "127.0.0.1:$REDIS_PORT" --fill -k 1 >/dev/null
  for r in $(seq 1 "$ROUNDS"); do
    for pipe in 1 16; do
      n=$N
      [ "$pipe" = 16 ] && n=$N16
      for target in direct cached $BASE_ON; do
        before=$(redis_gets)
        measure "hot-p$pipe" GET "$target" "$r" "parse_rb $n" -- \
          redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" -c "$CLIENTS" -n "$n" \
          -t get -P "$pipe" --csv
        after=$(redis_gets)
        [ "$target" != direct ] && echo "  hot-p$pipe round $r: $((after - before)) of $n GETs" \
          "reached Redis ($(python3 -c "print(f'{100*($after-$before)/$n:.4f}')")%)"
      done
      # corral-load's one key: a lighter client than redis-benchmark, whose own CPU caps
      # these runs near direct Redis's rate.
      for target in direct cached $BASE_ON; do
        measure "hot-p$pipe" LOAD "$target" "$r" parse_load -- \
          "$LOAD" --addr "127.0.0.1:${PORT[$target]}" -c "$CLIENTS" -P "$pipe" -k 1 \
          --get-ratio 1 --duration "$LOAD_SECONDS" --seed "$r" --csv
      done
    done
  done
  echo "  cached corral: $(redis-cli -p "${PORT[cached]}" corral cache stats | paste -sd' ' | cut -c1-300)"
}

# The tls scenario's own servers, started when it runs: a CA and one certificate for
# 127.0.0.1 (openssl), a redis-server with both a plain and a TLS port, and two corrals
# (--no-cache) in front of it: plain to plain, and TLS listener to rediss://.
start_tls() {
  local d=$WORK/tls port tport pid cpid cport ctport t
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=corral bench CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$d/server.key" -out "$d/server.csr" >/dev/null 2>&1
  printf 'subjectAltName=IP:127.0.0.1\n' >"$d/ext.cnf"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/ext.cnf" -out "$d/server.pem" >/dev/null 2>&1
  port=$(free_port)
  tport=$(free_port)
  "${ON_SERVER[@]}" redis-server --port "$port" --tls-port "$tport" --bind 127.0.0.1 \
    --save "" --appendonly no \
    --tls-cert-file "$d/server.pem" --tls-key-file "$d/server.key" \
    --tls-ca-cert-file "$d/ca.pem" --tls-auth-clients no \
    --daemonize no --logfile "$WORK/redis-tls.log" &
  pid=$!
  PIDS+=("$pid")
  wait_ready "$port" redis-tls "$pid"
  add_target rplain "$port" ""
  add_target rtls "$tport" ""
  cport=$(free_port)
  "${ON_SERVER[@]}" "$CORRAL" --no-cache --listen "127.0.0.1:$cport" \
    --upstream "redis://127.0.0.1:$port" \
    --log-level warn >"$WORK/cplain.log" 2>&1 &
  cpid=$!
  PIDS+=("$cpid")
  wait_ready "$cport" cplain "$cpid"
  add_target cplain "$cport" "$cpid"
  cport=$(free_port)
  ctport=$(free_port)
  printf '[upstream.tls]\nca_file = "%s"\n[tls]\ncert_file = "%s"\nkey_file = "%s"\n' \
    "$d/ca.pem" "$d/server.pem" "$d/server.key" >"$d/corral.toml"
  "${ON_SERVER[@]}" "$CORRAL" --config "$d/corral.toml" --no-cache \
    --listen "127.0.0.1:$cport" \
    --tls-listen "127.0.0.1:$ctport" --upstream "rediss://127.0.0.1:$tport" \
    --log-level warn >"$WORK/ctls.log" 2>&1 &
  cpid=$!
  PIDS+=("$cpid")
  wait_ready "$cport" ctls "$cpid"
  add_target ctls "$ctport" "$cpid"
  for t in rplain rtls cplain ctls; do REDIS_PIDS_OF[$t]=$pid; done
  TLS_ARGS="--tls --cacert $d/ca.pem"
}

# TLS on both sides against plain, and against Redis's own TLS; every target of a round back
# to back, as in the other scenarios.
scenario_tls() {
  local r pipe n test target extra
  start_tls
  for target in rplain rtls cplain ctls; do
    extra=""
    case "$target" in rtls|ctls) extra=$TLS_ARGS ;; esac
    # shellcheck disable=SC2086
    timeout "$RUN_TIMEOUT" redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" $extra \
      -c "$CLIENTS" -n 20000 -t set,get -P 16 -q >/dev/null 2>&1
  done
  for r in $(seq 1 "$ROUNDS"); do
    for pipe in 1 16; do
      n=$N
      [ "$pipe" = 16 ] && n=$N16
      for test in set get; do
        for target in rplain rtls cplain ctls; do
          extra=""
          case "$target" in rtls|ctls) extra=$TLS_ARGS ;; esac
          # shellcheck disable=SC2086
          measure "tls-p$pipe" "${test^^}" "$target" "$r" "parse_rb $n" -- \
            redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" $extra -c "$CLIENTS" -n "$n" \
            -t "$test" -P "$pipe" --csv
        done
      done
    done
  done
}

start_redis
start_nutcracker
start_corral corral "$CORRAL" --no-cache
start_corral cached "$CORRAL"
if [ -n "$BASELINE" ]; then
  start_corral base "$BASELINE" --no-cache
  start_corral basecached "$BASELINE"
fi
case " $SCENARIOS " in
  *" cluster "*) start_cluster; start_corral_cluster cluster --no-cache; start_corral_cluster clcached ;;
esac

# Warm every path (connections, allocator, page cache) before anything is recorded.
for target in "${TARGETS[@]}"; do
  timeout "$RUN_TIMEOUT" redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" -c "$CLIENTS" \
    -n 20000 -t set,get -P 16 -q ${REDIS_PIDS_OF[$target]:+-r 100000} >/dev/null 2>&1
done

echo "corral bench: N=$N N16=$N16 rounds=$ROUNDS clients=$CLIENTS scenarios=\"$SCENARIOS\"" \
  "redis :$REDIS_PORT nutcracker :${PORT[nutcracker]} corral :${PORT[corral]}" \
  "${PORT[cluster]:+corral-cluster :${PORT[cluster]} over $CLUSTER_SEEDS}" \
  "(CPU tick = $((1000000 / CLK_TCK)) us)" \
  "${PIN:+pinned: clients on CPUs ${PIN%%:*}, servers on CPUs ${PIN#*:}}"
: >"$RESULTS"
for s in $SCENARIOS; do
  declare -F "scenario_$s" >/dev/null || { echo "bench.sh: no scenario $s" >&2; exit 2; }
  "scenario_$s"
done

[ -n "$OUT" ] && cp "$RESULTS" "$OUT"
[ -z "$PIN" ] || echo "(pinned: clients on CPUs ${PIN%%:*}, servers on CPUs ${PIN#*:})"

python3 - "$RESULTS" "$N" "$N16" "$ROUNDS" "$LOAD_SECONDS" "$LOAD_KEYS" "$WARMUP" "$SETTLE" <<'EOF'
import statistics, sys
from collections import defaultdict

path, n, n16, rounds, load_s, load_keys, warmup, settle = sys.argv[1:]
runs = defaultdict(list)
rps_by_round = defaultdict(dict)
order = []
for line in open(path):
    # p99.9 is the last field; results written before it have none.
    sc, test, target, rnd, rps, p99, proxy, redis, idle, *p999 = line.rstrip("\n").split("\t")
    p999 = None if p999 in ([], ["-"]) else float(p999[0])
    if (sc, test) not in order:
        order.append((sc, test))
    runs[(sc, test, target)].append(
        (float(rps), float(p99), None if proxy == "-" else float(proxy), float(redis),
         float(idle), p999))
    rps_by_round[(sc, test, target)][rnd] = float(rps)

def med(key, i):
    vals = [r[i] for r in runs.get(key, []) if r[i] is not None]
    return statistics.median(vals) if vals else None

def ratio(sc, test, a, b):
    """Median over rounds of a's throughput over b's in the same round: the targets of one
    round ran back to back, so slow phases of the machine cancel out."""
    ra, rb = rps_by_round[(sc, test, a)], rps_by_round[(sc, test, b)]
    return statistics.median(ra[r] / rb[r] for r in ra if r in rb)

def fmt(v, spec):
    return format("-", spec.split(".")[0].rstrip("f")) if v is None else format(v, spec)

titles = {
    "p1": f"redis-benchmark -c 50 -n {n} -P 1",
    "p16": f"redis-benchmark -c 50 -n {n16} -P 16",
    "load": f"corral-load -c 50 -P 16, Zipf(0.99) over {load_keys} keys, 90% GET, {load_s} s",
    "cl-p1": f"cluster: redis-benchmark -c 50 -n {n} -r 100000 -P 1; cluster = corral --no-cache"
             " over 3 masters, clcached = with its cache on, redis us/req summed over the masters",
    "cl-p16": f"cluster: redis-benchmark -c 50 -n {n16} -r 100000 -P 16; cluster = corral --no-cache"
              " over 3 masters, clcached = with its cache on, redis us/req summed over the masters",
    **{f"{w}-p{p}": f"corral-load -c 50 -P {p}, {d} over {load_keys} keys, {load_s} s after"
       f" {warmup} s unmeasured on the cache-on targets;"
       " corral = --no-cache, cached = cache on"
       for w, d in (("zget", "Zipf(0.99) GET"), ("zmix", "Zipf(0.99) 90% GET / 10% SET"),
                    ("uget", "uniform GET (cold keys)")) for p in (1, 16)},
    **{f"zset-p{p}": f"corral-load -c 50 -P {p}, Zipf(0.99) GET over {load_keys} keys, {load_s} s,"
       f" each cache-on target right after {settle} s of Zipf GETs -P 16 (settled);"
       " corral = --no-cache, cached = cache on" for p in (1, 16)},
    "zsw-p16": f"corral-load -c 50 -P 16, Zipf(0.99) 90% GET / 10% SET over {load_keys} keys,"
               f" {load_s} s right after Zipf GETs (no warm-up: the cache switching over);"
               " corral = --no-cache, cached = cache on",
    **{f"wget-p{p}": f"corral-load -c 50 -P {p}, uniform GET over 100000 keys (a warm set, cache"
       f" warmed first), {load_s} s; corral = --no-cache, cached = cache on" for p in (1, 16)},
    **{f"rb{t}-p{p}": f"redis-benchmark -c 50 -t {t} -P {p} -r {load_keys} -d 64 (cold keys;"
       " half as many requests first, unmeasured, on the cache-on targets);"
       " corral = --no-cache, cached = cache on"
       for t in ("get", "set") for p in (1, 16)},
    **{f"tls-p{p}": f"TLS: redis-benchmark -c 50 -n {n if p == 1 else n16} -P {p}; rplain/rtls ="
       " Redis plain/TLS port, cplain = corral plain to plain, ctls = corral TLS to rediss://"
       " (both --no-cache)" for p in (1, 16)},
    **{f"hot-p{p}": f"one hot key: GET = redis-benchmark -c 50 -n {n if p == 1 else n16} -t get"
       f" -P {p}, LOAD = corral-load -c 50 -P {p} -k 1, {load_s} s; cached = corral, cache on"
       for p in (1, 16)},
}
checks = []
last = None
for sc, test in order:
    if sc != last:
        print(f"\n== {titles.get(sc, sc)}  (median of {rounds} rounds) ==")
        print(f"{'test':<5}{'target':<12}{'req/s':>12}{'p99 ms':>9}{'p99.9 ms':>10}"
              f"{'proxy us/req':>14}{'redis us/req':>14}{'idle %':>8}")
        last = sc
    m = {}
    for target in ("direct", "nutcracker", "corral", "cached", "cluster", "clcached", "base",
                   "basecached",
                   "rplain", "rtls", "cplain", "ctls"):
        key = (sc, test, target)
        if key not in runs:
            continue
        m[target] = [med(key, i) for i in range(6)]
        rps, p99, proxy, redis, idle, p999 = m[target]
        print(f"{test:<5}{target:<12}{rps:>12,.0f}{p99:>9.3f}{fmt(p999, '>10.3f')}"
              f"{fmt(proxy, '>14.3f')}{redis:>14.3f}{idle:>8.0f}")
    if {"direct", "corral", "cached"} <= m.keys():
        on_off = ratio(sc, test, "cached", "corral")
        cd = ratio(sc, test, "cached", "direct")
        od = ratio(sc, test, "corral", "direct")
        cpu = m["cached"][2] / m["corral"][2]
        rcpu = m["cached"][3] / m["direct"][3]
        print(f"     ratios (median of per-round): cached/corral {on_off:.2f}  cached/direct {cd:.2f}"
              f"  corral/direct {od:.2f};  proxy CPU cached/corral {cpu:.2f}"
              f"  redis CPU cached/direct {rcpu:.2f}")
        checks.append((f"{sc} cached/corral throughput", on_off, ">=", 0.95))
        checks.append((f"{sc} cached/corral proxy CPU per request", cpu, "<=", 1.1))
        if sc.startswith(("zget", "zmix", "zset")):
            checks.append((f"{sc} cached/corral throughput (skew)", on_off, ">=", 1.3))
            checks.append((f"{sc} cached/direct throughput", cd, ">=", 1.0))
            checks.append((f"{sc} redis CPU per request cached/direct", rcpu, "<=", 0.4))
        if sc == "rbget-p16" or sc == "rbset-p16":
            checks.append((f"{sc} corral/direct throughput", od, ">=", 0.85))
    elif {"direct", "cached"} <= m.keys():
        cd = ratio(sc, test, "cached", "direct")
        print(f"     throughput ratio (median of per-round ratios): cached/direct {cd:.2f}")
        if sc.startswith("hot"):
            checks.append((f"{sc} {test} cached corral/direct throughput", cd, ">=", 1.1))
            if sc == "hot-p16":
                checks.append((f"{sc} {test} cached proxy CPU us/request", m["cached"][2], "<=", 0.35))
    if {"direct", "corral", "cluster"} <= m.keys():
        kd = ratio(sc, test, "cluster", "direct")
        kc = ratio(sc, test, "cluster", "corral")
        print(f"     throughput ratios (median of per-round ratios): cluster/direct {kd:.2f}"
              f"  cluster/corral {kc:.2f}  corral/direct {ratio(sc, test, 'corral', 'direct'):.2f}")
    if {"cluster", "clcached"} <= m.keys():
        on_off = ratio(sc, test, "clcached", "cluster")
        cpu = m["clcached"][2] / m["cluster"][2]
        print(f"     cluster, cache on against --no-cache (median of per-round ratios): throughput"
              f" {on_off:.2f}, proxy CPU per request {cpu:.2f}")
        checks.append((f"{sc} {test} clcached/cluster throughput", on_off, ">=", 0.95))
        checks.append((f"{sc} {test} clcached/cluster proxy CPU per request", cpu, "<=", 1.1))
    if {"direct", "nutcracker", "corral"} <= m.keys():
        cd = ratio(sc, test, "corral", "direct")
        ct = ratio(sc, test, "corral", "nutcracker")
        td = ratio(sc, test, "nutcracker", "direct")
        print(f"     throughput ratios (median of per-round ratios): corral/direct {cd:.2f}"
              f"  corral/nutcracker {ct:.2f}  nutcracker/direct {td:.2f}")
        if sc == "p1":
            checks.append((f"p1  {test} corral/nutcracker throughput", ct, ">=", 1.2))
        if sc == "p16":
            checks.append((f"p16 {test} corral/direct throughput", cd, ">=", 0.85))
            checks.append((f"p16 {test} corral/nutcracker throughput", ct, ">=", 2.0))
            checks.append((f"p16 {test} corral CPU us/request", m["corral"][2], "<=", 1.0))
        if sc in ("p1", "p16"):
            checks.append((f"{sc:<3} {test} corral p99 / nutcracker p99", m["corral"][1] / m["nutcracker"][1], "<=", 1.0))

    if {"rplain", "rtls", "cplain", "ctls"} <= m.keys():
        print(f"     throughput ratios (median of per-round ratios): ctls/cplain"
              f" {ratio(sc, test, 'ctls', 'cplain'):.2f}  ctls/rtls {ratio(sc, test, 'ctls', 'rtls'):.2f}"
              f"  rtls/rplain {ratio(sc, test, 'rtls', 'rplain'):.2f};  proxy CPU ctls/cplain"
              f" {m['ctls'][2] / m['cplain'][2]:.2f}")

    for new, old in (("corral", "base"), ("cached", "basecached")):
        if {new, old} <= m.keys():
            print(f"     this build / baseline ({new}/{old}): throughput {ratio(sc, test, new, old):.2f}"
                  f"  proxy CPU per request {m[new][2] / m[old][2]:.2f}")

if checks:
    print("\n== targets ==")
    for name, v, op, goal in checks:
        ok = v >= goal if op == ">=" else v <= goal
        print(f"  [{'MET ' if ok else 'MISS'}] {name:<48} {v:7.3f}  (target {op} {goal})")
EOF
