# Sourced by the scripts that need a real S3-compatible server: moto's server mode (PyPI
# `moto[server]`, pinned; it implements conditional create, `If-None-Match: *`, which the
# cold store relies on).
#
#   source scripts/moto.sh
#   moto_start DIR          # installs moto if missing, starts it in DIR on a free loopback
#                           # port, creates $MOTO_BUCKET; sets MOTO_ENDPOINT and MOTO_PID
#   moto_stop               # from the caller's EXIT trap
#
# Exports the credentials and region every S3 client of the tests reads.

MOTO_VERSION=5.2.1
MOTO_BUCKET=${MOTO_BUCKET:-ursula-test}
MOTO_ENDPOINT=
MOTO_PID=

moto_installed() {
  python3 - "$MOTO_VERSION" <<'PY' 2>/dev/null
import sys
import moto, flask, flask_cors, werkzeug  # the server extra's modules
sys.exit(0 if moto.__version__ == sys.argv[1] else 1)
PY
}

moto_stop() {
  if [[ -n $MOTO_PID ]]; then
    kill "$MOTO_PID" 2>/dev/null || true
    wait "$MOTO_PID" 2>/dev/null || true
    MOTO_PID=
  fi
}

moto_start() {
  local dir=$1 port attempt
  command -v python3 >/dev/null || { echo "python3 is required for moto"; return 1; }
  if ! moto_installed; then
    echo "installing moto[server]==$MOTO_VERSION"
    python3 -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
    moto_installed || { echo "moto[server]==$MOTO_VERSION did not install"; return 1; }
  fi
  for attempt in 1 2 3; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    (cd "$dir" && exec python3 -m moto.server -H 127.0.0.1 -p "$port") >"$dir/moto.log" 2>&1 &
    MOTO_PID=$!
    for _ in $(seq 1 150); do
      if curl -sf -o /dev/null "http://127.0.0.1:$port/moto-api/"; then
        MOTO_ENDPOINT=http://127.0.0.1:$port
        break
      fi
      kill -0 "$MOTO_PID" 2>/dev/null || break
      sleep 0.1
    done
    [[ -n $MOTO_ENDPOINT ]] && break
    moto_stop
    echo "moto did not start on port $port (attempt $attempt):"
    tail -n 5 "$dir/moto.log"
  done
  [[ -n $MOTO_ENDPOINT ]] || { echo "could not start moto"; return 1; }
  echo "moto $MOTO_VERSION at $MOTO_ENDPOINT"
  export AWS_ACCESS_KEY_ID=ursula-test AWS_SECRET_ACCESS_KEY=ursula-test AWS_REGION=us-east-1
  curl -sf -X PUT -o /dev/null "$MOTO_ENDPOINT/$MOTO_BUCKET" ||
    { echo "cannot create bucket $MOTO_BUCKET"; return 1; }
}
