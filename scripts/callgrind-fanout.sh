#!/usr/bin/env bash
# Repeatable CPU cost of an SSE delivery: user-space instructions per delivered event,
# counted by valgrind's callgrind while ursula-bench's fanout scenario runs SUBS subscribers
# on one stream at RATE appends/s (the appends' own cost is included, spread over their
# deliveries). Kernel time (the socket writes) is not counted; use it to compare builds.
#
# usage: scripts/callgrind-fanout.sh [binary] ; env SUBS=20 RATE=10 SECONDS_MEASURED=6 OUT=dir
# prints: deliveries, instructions per delivery; leaves the callgrind file in $OUT.
set -euo pipefail
SUBS=${SUBS:-20}
RATE=${RATE:-10}
MEASURE=${SECONDS_MEASURED:-6}
# shellcheck source=lib/callgrind-server.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/callgrind-server.sh"
# Warm up (connections, allocator, first segment), then count only the measured run.
"$BENCH" --url "$URL" fanout --subscribers "$SUBS" --rate "$RATE" --duration 2s --quiet >/dev/null
callgrind_control -z "$VG" >/dev/null
"$BENCH" --url "$URL" fanout --subscribers "$SUBS" --rate "$RATE" --duration "${MEASURE}s" --quiet >"$OUT/bench.json"
callgrind_control -d "$VG" >/dev/null
IR=$(callgrind_annotate "$OUT/callgrind.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
DELIVERIES=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['deliveries'])" "$OUT/bench.json")
echo "deliveries $DELIVERIES  instructions/delivery $((IR / DELIVERIES))"
echo "callgrind file: $OUT/callgrind.out.1"
