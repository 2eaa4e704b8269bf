# Shared by the benchmark scripts (sourced): the processes they start, on free loopback
# ports, and the CPU those processes spend. The caller sets WORK (a directory for logs, each
# process's as WORK/NAME.log) and PIDS (what to stop on exit) before starting anything.

cleanup() {
  local pid i
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  # Give them a moment to exit, then make sure.
  for i in $(seq 1 30); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# pin_placement C:S: with a non-empty C:S (taskset CPU lists, say 0:1), moves this script,
# and so every client it starts from now on, to CPUs C, and sets ON_SERVER to the prefix
# that runs a server on CPUs S; with an empty one, ON_SERVER is empty.
ON_SERVER=()
pin_placement() {
  [ -n "$1" ] || return 0
  command -v taskset >/dev/null || { echo "$(basename "$0"): --pin needs taskset (util-linux)" >&2; exit 1; }
  [[ "$1" == ?*:?* ]] || { echo "$(basename "$0"): --pin wants CLIENT_CPUS:SERVER_CPUS, say 0:1" >&2; exit 2; }
  taskset -cp "${1%%:*}" $$ >/dev/null || { echo "$(basename "$0"): cannot pin to CPUs ${1%%:*}" >&2; exit 1; }
  ON_SERVER=(taskset -c "${1#*:}")
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_ready PORT NAME PID: PING until it answers (bounded), failing early if PID died.
wait_ready() {
  local i
  for i in $(seq 1 100); do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "$(basename "$0"): $2 exited; its log:" >&2; cat "$WORK/$2.log" >&2 || true; exit 1
    fi
    if [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = "PONG" ]; then return 0; fi
    sleep 0.1
  done
  echo "$(basename "$0"): $2 on port $1 not ready after 10 s" >&2; exit 1
}

CLK_TCK=$(getconf CLK_TCK)

# cpu_ticks PID: utime+stime of the whole process (all threads). Fields 14 and 15 of
# /proc/PID/stat, counted after the ")" closing the command name, which may hold spaces.
cpu_ticks() {
  local user sys
  read -r user sys <<< "$(cpu_split "$1")"
  echo $(( user + sys ))
}

# cpu_split PID: utime and stime of the whole process, apart ("USER SYS").
cpu_split() {
  local rest
  rest=$(cat "/proc/$1/stat")
  rest=${rest##*) }
  # shellcheck disable=SC2086
  set -- $rest
  echo "${12} ${13}"
}

