#!/usr/bin/env bash
# Builds the old-format data-dir fixture that crates/ursula-server/tests/upgrade.rs starts the
# current binary on (docs/storage.md, "Upgrading data dirs").
#
#   scripts/make-datadir-fixture.sh BINARY OUT_DIR
#
# BINARY is the `ursula` binary of the release whose format the fixture freezes; the committed
# fixture crates/ursula-server/tests/fixtures/datadir-v1 was made with the debug build of commit
# 2914ec9 (the release before versioned payloads). OUT_DIR must not exist; it receives
#   data/      the data dir, its WAL segments trimmed after their last record
#   expected/  what the old binary answered for every stream, once the data set was written
#
# The data set: a bucket; a byte stream and a JSON stream with appends; an idempotent producer
# (epoch 0, seqs 0..=2); a closed stream; a stream with a long sliding TTL and one whose
# absolute expiry has passed; a fork of the JSON stream; a published snapshot and advanced
# retention on the JSON stream; a stream of the compatibility layout. `--snapshot-logs 100` and
# 150 appends to one stream make its group write a snapshot file; everything written after the
# snapshot file appears, and every other group, lives only in the WAL.
set -euo pipefail
BIN=${1:?usage: make-datadir-fixture.sh BINARY OUT_DIR}
OUT=${2:?usage: make-datadir-fixture.sh BINARY OUT_DIR}
[[ -e $OUT ]] && { echo "$OUT exists"; exit 1; }
mkdir -p "$OUT/expected"
DATA=$OUT/data
LOG=$(mktemp)
NO_COLOR=1 "$BIN" server --listen 127.0.0.1:0 --data-dir "$DATA" --group-count 4 \
  --snapshot-logs 100 2>"$LOG" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
ADDR=
for _ in $(seq 1 300); do
  ADDR=$(grep -o 'addr=[0-9.:]*' "$LOG" | head -n1 | cut -d= -f2 || true)
  [[ -n $ADDR ]] && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
[[ -n $ADDR ]] || { cat "$LOG"; echo "server did not start"; exit 1; }
U=http://$ADDR

# req EXPECTED_STATUS METHOD PATH [curl args...]
req() {
  local want=$1 method=$2 path=$3
  shift 3
  local got
  got=$(curl -sS -o /dev/null -w '%{http_code}' -X "$method" "$@" "$U$path")
  [[ $got == "$want" ]] || { echo "$method $path: got $got, want $want"; exit 1; }
}
off20() { printf '%020d' "$1"; }
OCT=(-H 'Content-Type: application/octet-stream')
JSON=(-H 'Content-Type: application/json')

req 201 PUT /fixture
req 201 PUT /fixture/bytes "${OCT[@]}" --data-binary 'hello '
req 204 POST /fixture/bytes "${OCT[@]}" --data-binary 'byte '
req 201 PUT /fixture/json "${JSON[@]}" --data-binary '[{"n":0},{"n":1}]'
req 201 PUT /fixture/closed -H 'Content-Type: text/plain' --data-binary 'before close;'
req 201 PUT /fixture/ttl -H 'Content-Type: text/plain' -H 'Stream-TTL: 315360000' \
  --data-binary 'lives ten years'
req 201 PUT /fixture/expired -H 'Content-Type: text/plain' \
  -H "Stream-Expires-At: $(date -u -d '+2 seconds' +%Y-%m-%dT%H:%M:%SZ)" --data-binary 'gone'
req 201 PUT /fixture/many -H 'Content-Type: text/plain'

# Fill one group's log past snapshot_logs so that group writes a snapshot file.
for i in $(seq 1 150); do
  req 204 POST /fixture/many -H 'Content-Type: text/plain' --data-binary "m$i;"
done
for _ in $(seq 1 300); do
  compgen -G "$DATA/snapshots/group-*.snap" >/dev/null && break
  sleep 0.1
done
compgen -G "$DATA/snapshots/group-*.snap" >/dev/null || { echo "no snapshot file"; exit 1; }

# From here on: WAL only (for the snapshotted group, entries after its snapshot).
req 204 POST /fixture/bytes "${OCT[@]}" --data-binary 'stream'
req 204 POST /fixture/json "${JSON[@]}" --data-binary '[{"n":2},{"n":3}]'
req 204 POST /fixture/json "${JSON[@]}" --data-binary '{"n":4}'
req 204 POST /fixture/many -H 'Content-Type: text/plain' --data-binary 'after-snapshot;'
req 201 PUT /fixture/prod -H 'Content-Type: text/plain'
for seq in 0 1 2; do
  req 200 POST /fixture/prod -H 'Content-Type: text/plain' -H 'Producer-Id: writer-1' \
    -H 'Producer-Epoch: 0' -H "Producer-Seq: $seq" --data-binary "p$seq;"
done
req 204 POST /fixture/closed -H 'Content-Type: text/plain' -H 'Stream-Closed: true' \
  --data-binary 'last'
# JSON records are 8 canonical bytes each ({"n":i}): a snapshot at record 3, retention at 2.
req 204 PUT "/fixture/json/snapshot/$(off20 24)" -H 'Content-Type: application/octet-stream' \
  --data-binary 'snapshot-blob-at-24'
req 204 PUT "/fixture/json/retention/$(off20 16)"
req 201 PUT /fixture/fork -H 'Stream-Forked-From: /fixture/json' \
  -H "Stream-Fork-Offset: $(off20 32)"
req 204 POST /fixture/fork "${JSON[@]}" --data-binary '{"fork":true}'
req 201 PUT /v1/stream/compat/abc "${JSON[@]}" --data-binary '[{"c":1}]'
for _ in $(seq 1 100); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$U/fixture/expired") == 404 ]] && break
  sleep 0.1
done
req 404 GET /fixture/expired

# What the old binary answers, for the upgrade test to compare against: the headers a restart
# must preserve (HEAD; not Date, not the sliding TTL's countdown) and the bytes from the first
# retained offset.
for s in bytes:0 json:16 closed:0 ttl:0 many:0 prod:0 fork:16; do
  name=${s%%:*} from=${s##*:}
  curl -sS -I "$U/fixture/$name" | tr -d '\r' | tr 'A-Z' 'a-z' |
    grep -E '^(stream-next-offset|stream-closed|stream-incarnation|content-type|stream-snapshot-offset|stream-snapshot-digest|stream-retained-offset|stream-record-first|stream-forked-from|stream-fork-offset):' |
    sort >"$OUT/expected/$name.headers"
  curl -sS -f -o "$OUT/expected/$name.body" "$U/fixture/$name?offset=$(off20 "$from")"
done
curl -sS -o "$OUT/expected/json.snapshot" "$U/fixture/json/snapshot/$(off20 24)"

kill -TERM "$PID"
wait "$PID" || true
trap 'rm -f "$LOG"' EXIT

# Preallocated segments are zero-filled; zeros after the last record are legal, so drop them.
# The prepared next segment is all zeros and the lock file is empty: neither is state.
rm -f "$DATA/wal/wal-next.prepared"
python3 - "$DATA/wal" <<'EOF'
import os, sys
for name in sorted(os.listdir(sys.argv[1])):
    if not (name.startswith('wal-') and name.endswith('.log')):
        continue
    path = os.path.join(sys.argv[1], name)
    with open(path, 'rb') as f:
        data = f.read()
    # A record ends with payload bytes that may be zero: keep the whole record. Records are
    # `len u32 | crc u32 | body`, walked from the 24-byte segment header.
    off = 24
    while off + 8 <= len(data):
        n = int.from_bytes(data[off:off + 4], 'little')
        if n == 0:
            break
        off += 8 + n
    end = max(min(off, len(data)), 24)
    with open(path, 'r+b') as f:
        f.truncate(end)
EOF
du -sh "$OUT"
