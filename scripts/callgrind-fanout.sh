#!/usr/bin/env bash
# Repeatable CPU cost of an SSE delivery: user-space instructions per delivered event,
# counted by valgrind's callgrind while ursula-bench's fanout scenario runs SUBS subscribers
# on one stream at RATE appends/s (the appends' own cost is included, spread over their
# deliveries). Kernel time (the socket writes) is not counted; use it to compare builds.
#
# usage: scripts/callgrind-fanout.sh [binary] ; env SUBS=20 RATE=10 SECONDS_MEASURED=6 OUT=dir
# prints: deliveries, instructions per delivery; leaves the callgrind file in $OUT.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
BIN=${1:-$ROOT/target/release/ursula}
BENCH=$ROOT/target/release/ursula-bench
SUBS=${SUBS:-20}
RATE=${RATE:-10}
MEASURE=${SECONDS_MEASURED:-6}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
rm -f "$OUT"/callgrind.out*
command -v valgrind >/dev/null || { echo "valgrind is not installed"; exit 1; }
[[ -x $BIN && -x $BENCH ]] || { echo "build first: cargo build --release --workspace --bins"; exit 1; }

DATA=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
NO_COLOR=1 valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
  "$BIN" server --listen "127.0.0.1:$PORT" --data-dir "$DATA/data" 2>"$OUT/server.log" &
VG=$!
cleanup() { kill "$VG" 2>/dev/null || true; wait "$VG" 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
URL=http://127.0.0.1:$PORT
for _ in $(seq 1 600); do
  curl -sf "$URL/__ursula/health" >/dev/null && break
  sleep 0.1
done
curl -sf "$URL/__ursula/health" >/dev/null || { echo "server did not start"; exit 1; }
# Warm up (connections, allocator, first segment), then count only the measured run.
"$BENCH" --url "$URL" fanout --subscribers "$SUBS" --rate "$RATE" --duration 2s --quiet >/dev/null
callgrind_control -z "$VG" >/dev/null
"$BENCH" --url "$URL" fanout --subscribers "$SUBS" --rate "$RATE" --duration "${MEASURE}s" --quiet >"$OUT/bench.json"
callgrind_control -d "$VG" >/dev/null
IR=$(callgrind_annotate "$OUT/callgrind.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
DELIVERIES=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['deliveries'])" "$OUT/bench.json")
echo "deliveries $DELIVERIES  instructions/delivery $((IR / DELIVERIES))"
echo "callgrind file: $OUT/callgrind.out.1"
