# Sourced by scripts/callgrind-*.sh: starts `ursula server` under valgrind's callgrind on a
# free loopback port with a fresh data dir, waits until it serves, and sets
#   ROOT BIN BENCH OUT VG URL LOG
# (BIN: "$1" or target/release/ursula; OUT: $OUT or a new temp dir). The server and its data
# dir go away when the calling script exits.
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd -P)
BIN=${1:-$ROOT/target/release/ursula}
BENCH=$ROOT/target/release/ursula-bench
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
rm -f "$OUT"/callgrind.out*
command -v valgrind >/dev/null || { echo "valgrind is not installed"; exit 1; }
[[ -x $BIN && -x $BENCH ]] || { echo "build first: cargo build --release --workspace --bins"; exit 1; }

DATA=$(mktemp -d)
LOG=$OUT/server.log
NO_COLOR=1 valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
  "$BIN" server --listen 127.0.0.1:0 --data-dir "$DATA/data" 2>"$LOG" &
VG=$!
cleanup() { kill "$VG" 2>/dev/null || true; wait "$VG" 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
ADDR=
for _ in $(seq 1 600); do
  kill -0 "$VG" 2>/dev/null || break
  ADDR=$(grep -o 'addr=[0-9.:]*' "$LOG" | head -n1 | cut -d= -f2 || true)
  [[ -n $ADDR ]] && curl -sf "http://$ADDR/__ursula/health" >/dev/null && break
  ADDR=
  sleep 0.1
done
[[ -n $ADDR ]] || { echo "server did not start"; tail "$LOG"; exit 1; }
URL=http://$ADDR
