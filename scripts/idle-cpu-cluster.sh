#!/usr/bin/env bash
# The idle CPU of a 3-node cluster (heartbeats only), with and without batching Raft RPCs
# across groups (`[raft] rpc_batching`).
#
#   scripts/idle-cpu-cluster.sh [groups...]      # default: 4 64 256
#
# Per group count and batching mode: starts 3 release `ursula` processes on loopback ports
# (fresh data dirs, one shared local cold dir, balancer every 1 s), waits until every group
# has a leader and the leaderships are spread (each node leads at least groups/3 - 1), then
# samples every node's CPU over 10 s of no client traffic. Prints one line per run: mean CPU
# per node in % of one core, and the RPC batching counters of the window.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
BIN=${URSULA_BIN_DIR:-$ROOT/target/release}
GROUPS_LIST=("$@")
[[ ${#GROUPS_LIST[@]} -gt 0 ]] || GROUPS_LIST=(4 64 256)
WINDOW=10

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

prom() { curl -sf "http://127.0.0.1:$1/__ursula/metrics/prometheus"; }
metric() { sed -n "s/^$1 \([0-9]*\)$/\1/p"; }

cpu_ticks() {
  local t=0 f
  for p in "${PIDS[@]}"; do
    read -r -a f <"/proc/$p/stat"
    t=$((t + f[13] + f[14]))
  done
  echo "$t"
}

rpc_counts() {
  local b=0 f=0 s=0 out
  for p in "${PS[@]}"; do
    out=$(prom "$p")
    b=$((b + $(metric ursula_raft_rpc_batches_total <<<"$out")))
    f=$((f + $(metric ursula_raft_rpc_batched_frames_total <<<"$out")))
    s=$((s + $(metric ursula_raft_rpc_single_frames_total <<<"$out")))
  done
  echo "$b $f $s"
}

run() {
  local groups=$1 batching=$2
  TMP=$(mktemp -d)
  read -r -a PS < <(ports 3)
  {
    printf 'group_count = %d\n[server]\ncluster_id = "idle"\n' "$groups"
    printf '[raft]\ninit_membership_per_group = true\nrpc_batching = %s\n' "$batching"
    printf '[governance.leadership_balance]\ninterval = "1s"\nmax_per_tick = 32\n'
    printf '[storage.cold]\nbackend = "local"\n[storage.cold.local]\npath = "%s"\nshared = true\n' "$TMP/cold"
    for i in 0 1 2; do
      printf '[[raft.peers]]\nnode_id = %d\nurl = "http://127.0.0.1:%s"\n' $((i + 1)) "${PS[$i]}"
    done
  } >"$TMP/cluster.toml"
  for i in 0 1 2; do
    NO_COLOR=1 "$BIN/ursula" server --config "$TMP/cluster.toml" --node-id $((i + 1)) \
      --listen "127.0.0.1:${PS[$i]}" --data-dir "$TMP/n$i" 2>"$TMP/n$i.log" &
    PIDS+=($!)
  done
  local want=$((groups / 3 - 1)) spread=
  for _ in $(seq 1 600); do
    spread=yes
    for p in "${PS[@]}"; do
      led=$(prom "$p" 2>/dev/null | metric ursula_raft_groups_led) || led=
      [[ -n $led && $led -ge $want ]] || spread=
    done
    [[ -n $spread ]] && break
    sleep 0.2
  done
  [[ -n $spread ]] || { echo "groups=$groups: leaderships never spread" >&2; return 1; }
  read -r b0 f0 s0 < <(rpc_counts)
  local t0 t1
  t0=$(cpu_ticks)
  sleep "$WINDOW"
  t1=$(cpu_ticks)
  read -r b1 f1 s1 < <(rpc_counts)
  python3 -c '
import sys
g, mode, ticks, w, b, f, s = sys.argv[1:8]
pct = int(ticks) * 10 / 1000 / float(w) / 3 * 100
print("groups %4s batching %-5s cpu per node %5.1f %% of a core | %6d batches of %5.1f frames, %6d single frames per node per s" % (
    g, mode, pct, int(b) / float(w) / 3, int(f) / max(int(b), 1), int(s) / float(w) / 3))' \
    "$groups" "$batching" $((t1 - t0)) "$WINDOW" $((b1 - b0)) $((f1 - f0)) $((s1 - s0))
  stop_all
}

for g in "${GROUPS_LIST[@]}"; do
  run "$g" true
  run "$g" false
done
