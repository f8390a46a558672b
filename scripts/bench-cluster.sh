#!/usr/bin/env bash
# Append throughput and latency of a 3-node cluster beside a single node, with ursula-bench.
#
#   scripts/bench-cluster.sh [rounds] [duration]      # defaults: 3 rounds, 5s per run
#
# Per round and preset, in turn (fresh data dirs each run): `single` = one default node (4
# groups), `single-g1` = one node with 1 group, `cluster-g1` = 3 nodes (one config, one shared
# local cold dir, 1 group, fsync on as on the single node), the generator pointed at the node
# leading that group, so no request is redirected (ursula-bench does not follow redirects).
# When taskset exists, the servers run on CPU 0 and the generator on CPU 1 (single-threaded),
# like `ursula-bench compare`. Besides the leader's CPU per append (--server-pid), it adds
# every node's CPU over the whole generator run per append of that run. Prints one JSON line per run (the generator's, with "config"
# and "round" added) on stdout.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
BIN=${URSULA_BIN_DIR:-$ROOT/target/release}
ROUNDS=${1:-3}
DURATION=${2:-5s}
PRESETS=("append --streams 100 -c 32 --body-size 128"
         "append --streams 1 -c 16 --body-size 128"
         "append --producer --streams 100 -c 32 --body-size 128"
         "append --streams 1000 -c 256 --body-size 256")
SRV=() GENPIN=() GEN=()
if command -v taskset >/dev/null && [[ $(nproc) -ge 2 ]]; then
  SRV=(taskset -c 0) GENPIN=(taskset -c 1) GEN=(--threads 1)
fi

PIDS=() TMP=
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
  [[ -n $TMP ]] && rm -rf "$TMP"
  TMP=
}
trap stop_all EXIT

ports() {
  python3 -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$1/__ursula/ready" && return 0
    sleep 0.1
  done
  echo "node on port $1 never became ready" >&2
  return 1
}

# utime + stime of every node, in clock ticks (10 ms).
cpu_ticks() {
  local t=0 f
  for p in "${PIDS[@]}"; do
    read -r -a f <"/proc/$p/stat"
    t=$((t + f[13] + f[14]))
  done
  echo "$t"
}

# Starts a config; sets URL and LEADER_PID.
start() {
  TMP=$(mktemp -d)
  case $1 in
    single|single-g1)
      read -r P < <(ports 1)
      local g=()
      [[ $1 == single-g1 ]] && g=(--group-count 1)
      NO_COLOR=1 "${SRV[@]}" "$BIN/ursula" server --listen "127.0.0.1:$P" --data-dir "$TMP/d" \
        "${g[@]}" 2>"$TMP/node.log" &
      PIDS+=($!)
      wait_ready "$P"
      URL=http://127.0.0.1:$P LEADER_PID=${PIDS[0]}
      ;;
    cluster-g1)
      read -r -a PS < <(ports 3)
      {
        printf 'group_count = 1\n[server]\ncluster_id = "bench"\n[raft]\ninit_membership_per_group = true\n'
        printf '[storage.cold]\nbackend = "local"\n[storage.cold.local]\npath = "%s"\nshared = true\n' "$TMP/cold"
        for i in 0 1 2; do
          printf '[[raft.peers]]\nnode_id = %d\nurl = "http://127.0.0.1:%s"\n' $((i + 1)) "${PS[$i]}"
        done
      } >"$TMP/cluster.toml"
      for i in 0 1 2; do
        NO_COLOR=1 "${SRV[@]}" "$BIN/ursula" server --config "$TMP/cluster.toml" --node-id $((i + 1)) \
          --listen "127.0.0.1:${PS[$i]}" --data-dir "$TMP/n$i" 2>"$TMP/n$i.log" &
        PIDS+=($!)
      done
      for p in "${PS[@]}"; do wait_ready "$p"; done
      URL= LEADER_PID=
      for i in 0 1 2; do
        led=$(curl -sf "http://127.0.0.1:${PS[$i]}/__ursula/metrics/prometheus" |
          sed -n 's/^ursula_raft_groups_led \([0-9]*\)$/\1/p')
        [[ $led == 1 ]] && { URL=http://127.0.0.1:${PS[$i]}; LEADER_PID=${PIDS[$i]}; }
      done
      [[ -n $URL ]] || { echo "no leader found" >&2; return 1; }
      ;;
  esac
}

for round in $(seq 1 "$ROUNDS"); do
  for preset in "${PRESETS[@]}"; do
    for config in single single-g1 cluster-g1; do
      start "$config"
      before=$(cpu_ticks)
      # shellcheck disable=SC2086  # the preset is a word list
      line=$("${GENPIN[@]}" "$BIN/ursula-bench" "${GEN[@]}" --quiet --url "$URL" $preset \
        --duration "$DURATION" --warmup 1s --server-pid "$LEADER_PID")
      ticks=$(($(cpu_ticks) - before))
      printf '%s\n' "$line" | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
r["config"], r["round"] = sys.argv[1], int(sys.argv[2])
# CPU of every node over the whole generator run (setup and warm-up too), per append of the
# run (appends/s x (warm-up + measured window)): an upper bound, comparable across configs.
ops = r["appends_per_s"] * (r["duration_s"] + 1.0)
r["all_nodes_cpu_us_per_append"] = int(sys.argv[3]) * 10_000 / ops if ops else None
print(json.dumps(r))
lat, cpu = r["latency"], r.get("server_cpu") or {}
shape = "%sx%s%s" % (r["streams"], r["connections"], " producer" if r["producer"] else "")
print("%-10s r%s %-16s %8.0f/s p50 %8.0f us p99 %8.0f us cpu/append %s us errors %s" % (
    sys.argv[1], sys.argv[2], shape, r["appends_per_s"], lat["p50_us"], lat["p99_us"],
    cpu.get("us_per_op"), r["errors"]), file=sys.stderr)' "$config" "$round" "$ticks"
      stop_all
    done
  done
done
