#!/usr/bin/env bash
# Syscalls, context switches and CPU per append of one server, counted by `perf stat` on the
# kernel's syscall tracepoints while ursula-bench appends to it, and the CPU split into user
# space and kernel (/proc/PID/stat, in clock ticks). The server runs on CPU 0 and
# the generator on CPU 1 (as in `compare`), on a fresh data dir and a free loopback port.
# Counts cover the whole run (stream creation included, which is small beside the appends)
# and are divided by the appends the generator saw answered.
#
# usage: scripts/syscalls-append.sh [ursula|ds-rust]
#   env STREAMS=100 CONNS=32 SECONDS_MEASURED=6
#       URSULA=target/release/ursula DS_RUST=bench/peers/ds-rust/bin/durable-streams-server
# needs: perf (linux-perf) with access to tracepoints (root, or perf_event_paranoid <= -1).
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
KIND=${1:-ursula}
STREAMS=${STREAMS:-100}
CONNS=${CONNS:-32}
MEASURE=${SECONDS_MEASURED:-6}
URSULA=${URSULA:-$ROOT/target/release/ursula}
DS_RUST=${DS_RUST:-$ROOT/bench/peers/ds-rust/bin/durable-streams-server}
BENCH=$ROOT/target/release/ursula-bench
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)"; exit 1; }
[[ -x $BENCH ]] || { echo "build first: cargo build --release -p ursula-bench -p ursula-server"; exit 1; }

SERVER_CPU=() GEN_CPU=()
if command -v taskset >/dev/null && [[ $(nproc) -ge 2 ]]; then
  SERVER_CPU=(taskset -c 0) GEN_CPU=(taskset -c 1)
fi
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
DIR=$(mktemp -d)
case $KIND in
  ursula)
    [[ -x $URSULA ]] || { echo "no ursula binary at $URSULA"; exit 1; }
    "${SERVER_CPU[@]}" "$URSULA" server --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" >"$DIR/server.log" 2>&1 & ;;
  ds-rust)
    [[ -x $DS_RUST ]] || { echo "no ds-rust at $DS_RUST (scripts/install-bench-peers.sh ds-rust)"; exit 1; }
    "${SERVER_CPU[@]}" "$DS_RUST" --port "$PORT" --data-dir "$DIR/data" >"$DIR/server.log" 2>&1 & ;;
  *) echo "usage: $0 [ursula|ds-rust]"; exit 1 ;;
esac
PID=$!
PERF=
cleanup() {
  [[ -n $PERF ]] && kill "$PERF" 2>/dev/null || true
  kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
# Any HTTP answer means it serves.
for _ in $(seq 1 300); do
  kill -0 "$PID" 2>/dev/null || { echo "server exited:"; tail "$DIR/server.log"; exit 1; }
  curl -s -o /dev/null --max-time 1 "$URL/" && break
  sleep 0.1
done
curl -s -o /dev/null --max-time 1 "$URL/" || { echo "server did not start"; exit 1; }

EVENTS=context-switches,task-clock
for s in fdatasync fsync pwrite64 write writev sendto recvfrom read epoll_wait futex; do
  EVENTS+=,syscalls:sys_enter_$s
done
perf stat -x, -o "$DIR/perf.csv" -e "$EVENTS" -p "$PID" &
PERF=$!
sleep 0.5 # perf attaches before the first append
# utime and stime, fields 14 and 15 (the command name in field 2 has no spaces here).
read -r U0 S0 < <(awk '{print $14, $15}' "/proc/$PID/stat")
"${GEN_CPU[@]}" "$BENCH" --url "$URL" --quiet append --streams "$STREAMS" -c "$CONNS" \
  --body-size 128 --duration "${MEASURE}s" --warmup 0s >"$DIR/bench.json"
read -r U1 S1 < <(awk '{print $14, $15}' "/proc/$PID/stat")
kill -INT "$PERF"
wait "$PERF" 2>/dev/null || true
PERF=

python3 - "$KIND" "$DIR/bench.json" "$DIR/perf.csv" $((U1 - U0)) $((S1 - S0)) "$(getconf CLK_TCK)" <<'EOF'
import json, sys
kind, bench, perf = sys.argv[1:4]
user, system, tck = (int(x) for x in sys.argv[4:7])
run = json.loads(open(bench).read().strip().splitlines()[-1])
appends = run["appends"]
if appends <= 0:
    sys.exit("no appends were answered")
print(f"{kind}: {appends} appends, {run['appends_per_s']:.0f}/s, p99 {run['latency']['p99_us'] / 1000:.2f} ms")
for line in open(perf):
    f = line.strip().split(",")
    if len(f) < 3 or not f[0].replace(".", "", 1).isdigit():
        continue
    value, event = float(f[0]), f[2].replace("syscalls:sys_enter_", "")
    if event == "task-clock":  # milliseconds
        print(f"  {'CPU':<18} {value * 1000 / appends:8.1f} us per append")
    else:
        print(f"  {event:<18} {value / appends:8.3f} per append")
print(f"  {'user space':<18} {user * 1e6 / tck / appends:8.1f} us per append")
print(f"  {'kernel':<18} {system * 1e6 / tck / appends:8.1f} us per append")
EOF
