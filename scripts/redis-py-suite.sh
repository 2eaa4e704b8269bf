#!/usr/bin/env bash
# redis-py's own test suite (a client we did not write) run through corral: the sync and
# asyncio test files that apply to one plain Redis, first against redis-server directly,
# then through corral with its cache on and with --no-cache, each on a fresh redis-server
# on free 127.0.0.1 ports. A test that passes directly but fails or errors through corral
# is run once more on a fresh pair (timing-dependent tests then tell themselves apart);
# those that fail again are printed, and the script exits 1. What Redis itself fails
# (tests written for a newer Redis, say) is left out that way, and so are the differences
# README documents (KNOWN below).
#
# The first run downloads the redis-py sdist (its tests come with it) and makes a venv with
# pytest, both under target/redis-py (PyPI must be reachable); later runs reuse them. Needs
# redis-server 7 or later (its tests use DEBUG, which Redis 7 allows with a flag).
#
# Usage: scripts/redis-py-suite.sh [--corral BIN] [--protos "2 3"] [--modes "cache nocache"]
#                                  [--version 5.0.8] [-k EXPR]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CORRAL=target/release/corral PROTOS="2 3" MODES="cache nocache" VERSION=5.0.8 KEXPR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --corral) CORRAL=$2; shift 2 ;;
    --protos) PROTOS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --version) VERSION=$2; shift 2 ;;
    -k) KEXPR=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "redis-py-suite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$CORRAL" ] || { echo "redis-py-suite.sh: no corral at $CORRAL (cargo build --release)" >&2; exit 2; }
CORRAL=$(realpath "$CORRAL")

# Files that need only one plain Redis (no modules, cluster, sentinel, TLS or replicas). The
# asyncio ones run with pytest-asyncio's auto mode, as redis-py's own tox.ini (not in the
# sdist) sets: without it they are skipped.
FILES="test_commands.py test_pipeline.py test_pubsub.py test_scripting.py test_function.py
  test_lock.py test_connection.py test_connection_pool.py test_encoding.py test_hash.py
  test_helpers.py test_retry.py test_credentials.py test_monitor.py test_multiprocessing.py
  test_asyncio/test_commands.py test_asyncio/test_pipeline.py test_asyncio/test_pubsub.py
  test_asyncio/test_scripting.py test_asyncio/test_lock.py test_asyncio/test_connection.py
  test_asyncio/test_connection_pool.py test_asyncio/test_encoding.py test_asyncio/test_hash.py
  test_asyncio/test_retry.py test_asyncio/test_credentials.py test_asyncio/test_monitor.py"
MARKS="not onlycluster and not redismod and not ssl and not replica"
# Documented differences (README, "Commands"): MONITOR does not show the PINGs corral answers.
KNOWN="tests.test_monitor.TestMonitor::test_response_values
  tests.test_asyncio.test_monitor.TestMonitor::test_response_values[single]
  tests.test_asyncio.test_monitor.TestMonitor::test_response_values[pool]"

CACHE=$ROOT/target/redis-py
SRC=$CACHE/redis-$VERSION
if [ ! -d "$SRC/tests" ]; then
  mkdir -p "$CACHE"
  python3 -m pip download "redis==$VERSION" --no-deps --no-binary :all: -d "$CACHE" -q
  tar xzf "$CACHE/redis-$VERSION.tar.gz" -C "$CACHE"
fi
if [ ! -x "$CACHE/venv/bin/pytest" ]; then
  # Debian's own python3 needs the python3-venv package for this (scripts/deps.sh).
  python3 -m venv "$CACHE/venv"
  "$CACHE/venv/bin/pip" install -q "$SRC" pytest==7.4.4 pytest-timeout pytest-asyncio==0.21.2 mock packaging
fi

WORK=$(mktemp -d /tmp/redis-py-suite.XXXXXX)
PIDS=()
# shellcheck source=scripts/procs.sh
. scripts/procs.sh
# Fresh each run: a pass that wrote no results must not be compared with an old one's.
RESULTS=$ROOT/target/redis-py/results
rm -rf "$RESULTS"
mkdir -p "$RESULTS"

# run NAME PROTO [corral flags...]: one pass on a fresh redis-server (and corral unless NAME
# is "direct"), results in RESULTS/NAME-respPROTO.xml.
run() {
  local name=$1 proto=$2; shift 2
  local rport cport=""
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
    --enable-debug-command yes --dir "$WORK" >"$WORK/redis-$name.log" 2>&1 &
  local rpid=$!
  PIDS+=("$rpid")
  wait_ready "$rport" "redis-$name" "$rpid"
  local port=$rport
  if [ "$name" != direct ]; then
    cport=$(free_port)
    "$CORRAL" --listen "127.0.0.1:$cport" --upstream "redis://127.0.0.1:$rport" "$@" \
      >"$WORK/corral-$name.log" 2>&1 &
    local cpid=$!
    PIDS+=("$cpid")
    wait_ready "$cport" "corral-$name" "$cpid"
    port=$cport
  fi
  local tests=()
  if [ -n "${ONLY:-}" ]; then
    read -r -a tests <"$ONLY" || true  # one line, no newline at its end
  else
    for f in $FILES; do tests+=("tests/$f"); done
  fi
  local xml=$RESULTS/$name-resp$proto.xml
  (cd "$SRC" && timeout 3000 "$CACHE/venv/bin/python" -m pytest -p no:cacheprovider \
    --timeout 60 -q -o asyncio_mode=auto --redis-url="redis://127.0.0.1:$port/0" \
    --protocol="$proto" \
    -m "$MARKS" ${KEXPR:+-k "$KEXPR"} --junitxml="$xml" "${tests[@]}" \
    >"$RESULTS/$name-resp$proto.log" 2>&1) || true
  echo "$name RESP$proto: $(tail -1 "$RESULTS/$name-resp$proto.log")"
  kill "${PIDS[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  PIDS=()
}

# lost DIRECT.xml PROXIED.xml OUT: the tests passed directly and not through corral, but
# for KNOWN: printed, and written to OUT as pytest ids (and to OUT.names as they are named
# in the results). With RETRY=FILE.names, only those named there count, each one lost unless
# PROXIED.xml has it passed. Exits 1 if there is any (or a file is missing).
lost() {
  KNOWN=$KNOWN python3 - "$@" <<'PY'
import os
import sys
import xml.etree.ElementTree as ET

def outcomes(path):
    """Each test's worst outcome (a teardown error adds to a passed test)."""
    rank = {"passed": 0, "skipped": 1, "error": 2, "failure": 3}
    out = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        state, why = "passed", ""
        for child in case:
            if child.tag in rank and rank[child.tag] > rank[state]:
                state, why = child.tag, (child.get("message") or "")[:200].replace("\n", " ")
        old = out.get(name, ("passed", ""))
        out[name] = max(old, (state, why), key=lambda o: rank[o[0]])
    return out

direct, proxied = outcomes(sys.argv[1]), outcomes(sys.argv[2])
known = set(os.environ["KNOWN"].split())
passed = [n for n, (s, _) in direct.items() if s == "passed"]
if os.environ.get("RETRY"):
    with open(os.environ["RETRY"]) as f:
        again = set(f.read().split("\n")) - {""}
    passed = [n for n in passed if n in again]
lost = [n for n in passed if proxied.get(n, ("missing",))[0] != "passed" and n not in known]
print(f"  {sys.argv[2].rsplit('/', 1)[-1]}: {len(lost)} of {len(passed)} direct passes lost")
for n in lost:
    state, why = proxied.get(n, ("missing", ""))
    print(f"    {state}: {n}\n      {why}")
with open(sys.argv[3], "w") as f:
    # classname tests.test_x.TestY::name -> tests/test_x.py::TestY::name
    ids = []
    for n in lost:
        cls, test = n.split("::", 1)
        parts = cls.split(".")
        mod = [p for p in parts if p.startswith("test_")][-1]
        path = "/".join(parts[: parts.index(mod) + 1]) + ".py"
        rest = parts[parts.index(mod) + 1 :]
        ids.append("::".join([path, *rest, test]))
    f.write(" ".join(ids))
with open(sys.argv[3] + ".names", "w") as f:
    f.write("\n".join(lost))
sys.exit(1 if lost else 0)
PY
}

FAILED=0
for proto in $PROTOS; do
  run direct "$proto"
  for mode in $MODES; do
    case "$mode" in
      cache) flags=() ;;
      nocache) flags=(--no-cache) ;;
      *) echo "redis-py-suite.sh: unknown mode $mode" >&2; exit 2 ;;
    esac
    run "$mode" "$proto" "${flags[@]}"
    ids=$RESULTS/$mode-resp$proto.lost
    lost "$RESULTS/direct-resp$proto.xml" "$RESULTS/$mode-resp$proto.xml" "$ids" && continue
    echo "  again, on a fresh pair:"
    ONLY=$ids run "$mode-again" "$proto" "${flags[@]}"
    RETRY=$ids.names lost "$RESULTS/direct-resp$proto.xml" \
      "$RESULTS/$mode-again-resp$proto.xml" "$ids.again" || FAILED=1
  done
done
exit $FAILED
