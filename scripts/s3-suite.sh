#!/usr/bin/env bash
# The ColdStore conformance suite against a real S3-compatible server: moto's server mode
# (scripts/moto.sh: `moto[server]`, pinned; it implements conditional create,
# `If-None-Match: *`, which the suite checks). Installs moto if the pinned version is missing,
# starts it on a free loopback port in a temporary directory, creates the test bucket, runs the
# suite, the cold tier of one node and a 3-node cluster on it, and stops it. (The conformance
# suite through a cluster follower runs on its own moto: scripts/conformance-cluster.sh.)
#
#   scripts/s3-suite.sh [cargo test flags, e.g. --release]
#
# It never skips silently: it fails when the server cannot be installed or started. For local
# development without Python, URSULA_SKIP_S3_SUITE=1 skips it with a loud message.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
# shellcheck source=moto.sh
source "$ROOT/scripts/moto.sh"

if [[ ${URSULA_SKIP_S3_SUITE:-} == 1 ]]; then
  printf '\n!!! URSULA_SKIP_S3_SUITE=1: the S3 ColdStore suite was NOT run !!!\n\n' >&2
  exit 0
fi
TMP=$(mktemp -d)
cleanup() {
  moto_stop
  rm -rf "$TMP"
}
trap cleanup EXIT
moto_start "$TMP"
ENDPOINT=$MOTO_ENDPOINT
BUCKET=$MOTO_BUCKET

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
