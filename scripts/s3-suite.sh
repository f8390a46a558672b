#!/usr/bin/env bash
# The ColdStore conformance suite against a real S3-compatible server: moto's server mode
# (PyPI `moto[server]`, pinned below; it implements conditional create, `If-None-Match: *`,
# which the suite checks). Installs moto if the pinned version is missing, starts it on a free
# loopback port in a temporary directory, creates the test bucket, runs the suite, the cold tier
# of one node and a 3-node cluster on it, and stops it.
#
#   scripts/s3-suite.sh [cargo test flags, e.g. --release]
#
# It never skips silently: it fails when the server cannot be installed or started. For local
# development without Python, URSULA_SKIP_S3_SUITE=1 skips it with a loud message.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
MOTO_VERSION=5.2.1
BUCKET=ursula-test

if [[ ${URSULA_SKIP_S3_SUITE:-} == 1 ]]; then
  printf '\n!!! URSULA_SKIP_S3_SUITE=1: the S3 ColdStore suite was NOT run !!!\n\n' >&2
  exit 0
fi
command -v python3 >/dev/null || { echo "python3 is required for the S3 suite (moto)"; exit 1; }
have_moto() {
  python3 - "$MOTO_VERSION" <<'PY' 2>/dev/null
import sys
import moto, flask, flask_cors, werkzeug  # the server extra's modules
sys.exit(0 if moto.__version__ == sys.argv[1] else 1)
PY
}
if ! have_moto; then
  echo "installing moto[server]==$MOTO_VERSION"
  python3 -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
  have_moto || { echo "moto[server]==$MOTO_VERSION did not install"; exit 1; }
fi

TMP=$(mktemp -d)
PID=
cleanup() {
  [[ -n $PID ]] && { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
ENDPOINT=
for attempt in 1 2 3; do
  PORT=$(free_port)
  (cd "$TMP" && exec python3 -m moto.server -H 127.0.0.1 -p "$PORT") >"$TMP/moto.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 150); do
    if curl -sf -o /dev/null "http://127.0.0.1:$PORT/moto-api/"; then
      ENDPOINT=http://127.0.0.1:$PORT
      break
    fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n $ENDPOINT ]] && break
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=
  echo "moto did not start on port $PORT (attempt $attempt):"
  tail -n 5 "$TMP/moto.log"
done
[[ -n $ENDPOINT ]] || { echo "could not start moto"; exit 1; }
echo "moto $MOTO_VERSION at $ENDPOINT"

export AWS_ACCESS_KEY_ID=ursula-test AWS_SECRET_ACCESS_KEY=ursula-test AWS_REGION=us-east-1
curl -sf -X PUT -o /dev/null "$ENDPOINT/$BUCKET" || { echo "cannot create bucket $BUCKET"; exit 1; }

OUT=$TMP/suite.out
set +e
URSULA_TEST_S3_ENDPOINT=$ENDPOINT URSULA_TEST_S3_BUCKET=$BUCKET \
  cargo test -p ursula-storage "$@" --lib -- --ignored --exact cold::tests::suite_s3 2>&1 | tee "$OUT"
RC=${PIPESTATUS[0]}
set -e
if [[ $RC -ne 0 ]] || ! grep -q 'test result: ok. 1 passed' "$OUT"; then
  echo "S3 ColdStore suite failed (moto log: last lines)"
  tail -n 20 "$TMP/moto.log"
  exit 1
fi
echo "S3 ColdStore suite passed against moto $MOTO_VERSION"

# The cold tier of the real binary (flush, reads across tiers, restart) on the same server.
OUT=$TMP/tier.out
set +e
URSULA_TEST_S3_ENDPOINT=$ENDPOINT URSULA_TEST_S3_BUCKET=$BUCKET \
  cargo test -p ursula-server "$@" --test cold_tier -- --ignored --exact \
  the_cold_tier_works_on_a_real_s3_server 2>&1 | tee "$OUT"
RC=${PIPESTATUS[0]}
set -e
if [[ $RC -ne 0 ]] || ! grep -q 'test result: ok. 1 passed' "$OUT"; then
  echo "the cold tier on S3 failed (moto log: last lines)"
  tail -n 20 "$TMP/moto.log"
  exit 1
fi
echo "the cold tier works against moto $MOTO_VERSION"

# Three real processes sharing one bucket and prefix: flushes, a leader SIGKILLed, cold
# catch-up reads from every node (tests/cluster_s3.rs).
OUT=$TMP/cluster.out
set +e
URSULA_TEST_S3_ENDPOINT=$ENDPOINT URSULA_TEST_S3_BUCKET=$BUCKET \
  cargo test -p ursula-server "$@" --test cluster_s3 -- --ignored --exact \
  a_cluster_shares_one_s3_bucket_across_a_leader_kill 2>&1 | tee "$OUT"
RC=${PIPESTATUS[0]}
set -e
if [[ $RC -ne 0 ]] || ! grep -q 'test result: ok. 1 passed' "$OUT"; then
  echo "the 3-node cluster on S3 failed (moto log: last lines)"
  tail -n 20 "$TMP/moto.log"
  exit 1
fi
echo "a 3-node cluster shares one bucket on moto $MOTO_VERSION"
