#!/usr/bin/env bash
# Repeatable CPU cost of a durable append: user-space instructions per append, counted by
# valgrind's callgrind while ursula-bench appends over CONNS connections (default 1, so every
# append is its own batch and the count does not depend on timing). Kernel time (TCP, fsync)
# is not counted; use it to compare builds, not as a throughput figure.
#
# usage: scripts/callgrind-append.sh [binary] ; env CONNS=1 SECONDS_MEASURED=8 OUT=dir
# prints: appends, appends per WAL sync, instructions per append; leaves the callgrind file
# in $OUT for callgrind_annotate.
set -euo pipefail
CONNS=${CONNS:-1}
MEASURE=${SECONDS_MEASURED:-8}
# shellcheck source=lib/callgrind-server.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/callgrind-server.sh"
metric() { curl -s "$URL/__ursula/metrics/prometheus" | awk -v m="$1" '$1 == m {print $2}'; }

# Warm up (streams created, code paths hot), then count only the measured window.
"$BENCH" --url "$URL" append --streams 10 -c "$CONNS" --body-size 128 --duration 3s --warmup 0s --quiet >/dev/null
a0=$(metric ursula_appends_total); s0=$(metric ursula_wal_syncs_total)
callgrind_control -z "$VG" 2>&1 | grep -q OK || { echo "callgrind_control -z failed"; exit 1; }
"$BENCH" --url "$URL" append --streams 10 -c "$CONNS" --body-size 128 --duration "${MEASURE}s" --warmup 0s --quiet >/dev/null
callgrind_control -d "$VG" 2>&1 | grep -q OK || { echo "callgrind_control -d failed"; exit 1; }
a1=$(metric ursula_appends_total); s1=$(metric ursula_wal_syncs_total)
cleanup
trap - EXIT

# The dump requested above; the one valgrind writes at exit is plain callgrind.out.
DUMP=$OUT/callgrind.out.1
[[ -s $DUMP ]] || { echo "no callgrind dump in $OUT"; exit 1; }
IR=$(callgrind_annotate "$DUMP" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
python3 - "${a0:-0}" "${a1:-0}" "${s0:-0}" "${s1:-0}" "${IR:-0}" "$DUMP" <<'EOF'
import sys
a0, a1, s0, s1, ir = (float(x) for x in sys.argv[1:6])
appends, syncs = a1 - a0, max(s1 - s0, 1)
if appends <= 0 or ir <= 0:
    sys.exit(f"nothing measured: {appends:.0f} appends, {ir:.0f} instructions")
print(f"appends {appends:.0f}  appends/sync {appends / syncs:.2f}  instructions/append {ir / appends:.0f}")
print(f"callgrind file: {sys.argv[6]}")
EOF
