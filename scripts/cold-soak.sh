#!/usr/bin/env bash
# Cold-tier soak (docs/benchmarks.md, "Cold tier: 4 GiB over 100 streams"): start a release
# `ursula server` on a free loopback port with a fresh temp data dir, run
# `ursula-bench cold-soak` against it (append, RSS peak, data dir after the WAL purge, read
# back exact), SIGKILL the server, restart it on the same data dir and port, measure the time
# to the first `GET /__ursula/ready` = 200 and the logged `recovery_ms`, read every byte back
# again (`cold-soak --run ID`), and print a summary. Loopback only; every wait is bounded; the
# temp dir is removed on exit (KEEP=1 keeps it).
#
# Environment (defaults in brackets):
#   URSULA_BIN [target/release/ursula]  BENCH_BIN [target/release/ursula-bench]
#   TOTAL [4GiB]  STREAMS [100]  APPEND_SIZE [256KiB]  CONNS [8]
#   CONFIG  a TOML file passed to the server with --config (e.g. a small hot bound)
#   SOAK_TMP [TMPDIR or /tmp]: where the data dir goes (needs ~2.5x TOTAL free)
#   PURGE_SETTLE [10s]  PURGE_TIMEOUT [120s]  READY_TIMEOUT_S [60]
#   OUT: file that receives the JSON lines and the summary (default: inside the temp dir)
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
URSULA_BIN=${URSULA_BIN:-$ROOT/target/release/ursula}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/ursula-bench}
TOTAL=${TOTAL:-4GiB}
STREAMS=${STREAMS:-100}
APPEND_SIZE=${APPEND_SIZE:-256KiB}
CONNS=${CONNS:-8}
PURGE_SETTLE=${PURGE_SETTLE:-10s}
PURGE_TIMEOUT=${PURGE_TIMEOUT:-120s}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}
for b in "$URSULA_BIN" "$BENCH_BIN"; do
  [[ -x $b ]] || { echo "cold-soak: $b not found (cargo build --release)" >&2; exit 2; }
done
command -v curl >/dev/null || { echo "cold-soak: needs curl" >&2; exit 2; }

TMP=$(mktemp -d "${SOAK_TMP:-${TMPDIR:-/tmp}}/ursula-cold-soak.XXXXXX")
DATA=$TMP/data
OUT=${OUT:-$TMP/results.txt}
PID=
cleanup() {
  if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  if [[ ${KEEP:-0} == 1 ]]; then echo "cold-soak: kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

CONFIG_ARGS=()
[[ -n ${CONFIG:-} ]] && CONFIG_ARGS=(--config "$CONFIG")

# start LISTEN LOG: start the server in the background, PID set.
start() {
  NO_COLOR=1 "$URSULA_BIN" server "${CONFIG_ARGS[@]}" --listen "$1" --data-dir "$DATA" 2>"$2" &
  PID=$!
}

# wait_addr LOG: print the logged listen address (bounded).
wait_addr() {
  local addr=
  for _ in $(seq 1 $((READY_TIMEOUT_S * 10))); do
    addr=$(grep -o 'addr=[0-9.:]*' "$1" | head -n1 | cut -d= -f2 || true)
    [[ -n $addr ]] && { echo "$addr"; return 0; }
    kill -0 "$PID" 2>/dev/null || { cat "$1" >&2; echo "cold-soak: server exited" >&2; return 1; }
    sleep 0.1
  done
  cat "$1" >&2
  echo "cold-soak: server did not log its address" >&2
  return 1
}

now_ms() { date +%s%3N; }

# wait_ready ADDR: poll /__ursula/ready every 20 ms until 200 (bounded).
wait_ready() {
  local deadline=$(( $(now_ms) + READY_TIMEOUT_S * 1000 ))
  while (( $(now_ms) < deadline )); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://$1/__ursula/ready" || true)
    [[ $code == 200 ]] && return 0
    kill -0 "$PID" 2>/dev/null || { echo "cold-soak: server exited" >&2; return 1; }
    sleep 0.02
  done
  echo "cold-soak: not ready within ${READY_TIMEOUT_S}s" >&2
  return 1
}

# json FIELD FILE: one numeric/string/bool field of the last JSON line (no jq needed).
json() { grep '^{' "$2" | tail -n1 | grep -o "\"$1\":[^,}]*" | head -n1 | cut -d: -f2- | tr -d '"'; }

echo "cold-soak: $TOTAL over $STREAMS streams, $APPEND_SIZE appends, $CONNS conns; data dir $DATA" >&2
start 127.0.0.1:0 "$TMP/server1.log"
ADDR=$(wait_addr "$TMP/server1.log")
PORT=${ADDR##*:}
wait_ready "$ADDR"
echo "cold-soak: server pid $PID at $ADDR" >&2

# Timeline for investigation: every 2 s the server's RSS (anon/file) and its tier metrics.
TIMELINE=$TMP/timeline.txt
(
  echo "t_s rss_kib rss_anon_kib rss_file_kib hot_bytes cold_bytes wal_disk_bytes cold_backpressure_total"
  T=$(now_ms)
  for _ in $(seq 1 3600); do
    [[ -r /proc/$PID/status ]] || break
    S=$(awk '/^(VmRSS|RssAnon|RssFile):/ {printf "%s ", $2}' "/proc/$PID/status")
    M=$(curl -s --max-time 1 "http://$ADDR/__ursula/metrics" | tr -d '\n' || true)
    m() { grep -o "\"$1\":[0-9]*" <<<"$M" | cut -d: -f2; }
    echo "$(( ($(now_ms) - T) / 1000 )) $S$(m hot_bytes) $(m cold_bytes) $(m wal_disk_bytes) $(m cold_backpressure_total)"
    sleep 2
  done
) >"$TIMELINE" 2>/dev/null &
TL_PID=$!

set +e
"$BENCH_BIN" --url "http://$ADDR" cold-soak --total-bytes "$TOTAL" --streams "$STREAMS" \
  --append-size "$APPEND_SIZE" -c "$CONNS" --server-pid "$PID" --data-dir "$DATA" \
  --purge-settle "$PURGE_SETTLE" --purge-timeout "$PURGE_TIMEOUT" >"$TMP/soak.json"
RC1=$?
set -e
cat "$TMP/soak.json" >>"$OUT"
kill "$TL_PID" 2>/dev/null || true
wait "$TL_PID" 2>/dev/null || true
{ echo "== timeline (server during the soak) =="; cat "$TIMELINE"; } >>"$OUT"
RUN=$(json run "$TMP/soak.json")
[[ -n $RUN ]] || { tail -n 20 "$TMP/server1.log" >&2; echo "cold-soak: the soak produced no report (rc $RC1)" >&2; exit 1; }
METRICS_BEFORE_KILL=$(curl -s --max-time 5 "http://$ADDR/__ursula/metrics" | tr -d '\n' || true)

# SIGKILL, restart on the same dir and port, time to ready.
kill -KILL "$PID"
wait "$PID" 2>/dev/null || true
PID=
T0=$(now_ms)
start "127.0.0.1:$PORT" "$TMP/server2.log"
wait_ready "127.0.0.1:$PORT"
T1=$(now_ms)
READY_MS=$((T1 - T0))
RECOVERY_MS=$(grep -o 'recovery_ms=[0-9]*' "$TMP/server2.log" | head -n1 | cut -d= -f2 || true)
RSS_RESTART_KIB=$(awk '/^VmRSS:/ {print $2}' "/proc/$PID/status" 2>/dev/null || echo '?')
echo "cold-soak: restarted after SIGKILL, ready in ${READY_MS} ms (recovery_ms=${RECOVERY_MS:-?}), RSS ${RSS_RESTART_KIB} KiB" >&2

set +e
"$BENCH_BIN" --url "http://127.0.0.1:$PORT" cold-soak --run "$RUN" --total-bytes "$TOTAL" \
  --streams "$STREAMS" -c "$CONNS" --server-pid "$PID" >"$TMP/reread.json"
RC2=$?
set -e
cat "$TMP/reread.json" >>"$OUT"

num() { awk -v x="${1:-0}" 'BEGIN { printf "%.1f", x }'; }
gib() { awk -v b="${1:-0}" 'BEGIN { printf "%.3f GiB", b / 1073741824 }'; }
mibk() { awk -v k="${1:-0}" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }
DIRJ=$(grep '^{' "$TMP/soak.json" | tail -n1 | grep -o '"dir_settled":{[^}]*}' || true)
field() { grep -o "\"$1\":[0-9]*" <<<"$DIRJ" | cut -d: -f2; }
{
  echo "== cold-soak summary =="
  echo "shape:              $TOTAL over $STREAMS streams, $APPEND_SIZE appends, $CONNS connections${CONFIG:+, config $CONFIG}"
  echo "append:             $(num "$(json append_mb_per_s "$TMP/soak.json")") MB/s in $(num "$(json append_s "$TMP/soak.json")") s, $(json appends "$TMP/soak.json") appends"
  echo "backpressure 503s:  $(json backpressure "$TMP/soak.json") (other retries $(json retries "$TMP/soak.json"))"
  echo "server RSS peak:    $(mibk "$(json rss_peak_kib "$TMP/soak.json")") (append $(mibk "$(json rss_peak_append_kib "$TMP/soak.json")"), read $(mibk "$(json rss_peak_read_kib "$TMP/soak.json")"))"
  echo "data dir settled:   wal $(gib "$(field wal_bytes)"), cold $(gib "$(field cold_bytes)"), other $(gib "$(field other_bytes)"), total $(gib "$(field total_bytes)") = $(awk -v x="$(json dir_ratio "$TMP/soak.json")" 'BEGIN { printf "%.3f", x }') x bytes held (settled: $(json purge_settled "$TMP/soak.json") after $(num "$(json purge_wait_s "$TMP/soak.json")") s)"
  echo "cold read:          $(num "$(json read_mb_per_s "$TMP/soak.json")") MB/s, verified: $(json verified "$TMP/soak.json")"
  echo "restart (SIGKILL):  ready in ${READY_MS} ms, recovery_ms=${RECOVERY_MS:-?}, RSS after restart $(mibk "$RSS_RESTART_KIB")"
  echo "re-read after restart: $(num "$(json read_mb_per_s "$TMP/reread.json")") MB/s, verified: $(json verified "$TMP/reread.json"), RSS peak $(mibk "$(json rss_peak_kib "$TMP/reread.json")")"
  echo "metrics before kill: $METRICS_BEFORE_KILL" | cut -c1-2000
} | tee -a "$OUT" >&2
[[ $OUT == "$TMP"/* && ${KEEP:-0} != 1 ]] || echo "cold-soak: results in $OUT" >&2
if [[ $RC1 -ne 0 || $RC2 -ne 0 ]]; then
  echo "cold-soak: FAILED (soak rc $RC1, re-read rc $RC2)" >&2
  exit 1
fi
echo "cold-soak: OK" >&2
