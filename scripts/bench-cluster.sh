#!/usr/bin/env bash
# Append throughput and latency of a 3-node cluster beside a single node, with ursula-bench.
#
#   scripts/bench-cluster.sh [rounds] [duration]      # defaults: 3 rounds, 5s per run
#   CONFIGS="single-g12 cluster-g12" scripts/bench-cluster.sh 2 5s   # only these configs
#   SHAPES="0 1" ...                # only these presets (indices into PRESETS below)
#   RAFT_EXTRA="rpc_batching = false" ...   # lines added to the clusters' [raft] table
#   URSULA_BIN_DIR=DIR ...          # ursula and ursula-bench from DIR, not target/release
#
# Per round and preset, in turn (fresh data dirs each run): `single` = one default node (4
# groups), `single-gN` = one node with N groups, `cluster-g1` = 3 nodes (one config, one
# shared local cold dir, 1 group, fsync on as on the single node), the generator pointed at
# the node leading that group, so no request is redirected; `cluster-gN` (N > 1) = the same
# 3 nodes with N groups and the leadership balancer checking every second, measured once
# every group has a leader and the nodes lead N/3 each (within one), the generator pointed
# at node 1: about two thirds of the streams are led by another node, and ursula-bench
# follows each one's first `307` and then sends that stream's appends to its leader (per
# connection). `cluster-gN-on1` = the same with the balancer off and every leadership moved
# to node 1 (admin transfer route) before measuring: N groups, no redirect, to tell the cost
# of N groups from that of leaders on several nodes. The JSON gets "leaders_per_node" and,
# on a cluster, "term_changes" (the growth of the groups' terms over the run: elections);
# "redirects" is the generator's count (cluster redirects it followed, setup included).
# When taskset exists, the servers run on CPU 0 and the generator on CPU 1 (single-threaded),
# like `ursula-bench compare`. Besides the CPU per append of the node the generator is
# pointed at (--server-pid), it adds every node's CPU over the whole generator run per
# append of that run. Prints one JSON line per run (the generator's, with "config" and
# "round" added) on stdout.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
BIN=${URSULA_BIN_DIR:-$ROOT/target/release}
ROUNDS=${1:-3}
DURATION=${2:-5s}
PRESETS=("append --streams 100 -c 32 --body-size 128"
         "append --streams 1 -c 16 --body-size 128"
         "append --producer --streams 100 -c 32 --body-size 128"
         "append --streams 1000 -c 256 --body-size 256")
read -r -a CONFIGS <<<"${CONFIGS:-single single-g1 cluster-g1 single-g12 cluster-g12}"
if [[ -n ${SHAPES:-} ]]; then
  read -r -a pick <<<"$SHAPES"
  all=("${PRESETS[@]}") PRESETS=()
  for i in "${pick[@]}"; do PRESETS+=("${all[$i]}"); done
fi
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

# Groups led by each node (its own `raft_groups[].state`), space-separated, or nothing if a
# node does not answer.
leaders_per_node() {
  local out=() n
  for p in "${PS[@]}"; do
    n=$(curl -sf --max-time 2 "http://127.0.0.1:$p/__ursula/metrics" | python3 -c '
import json, sys
print(sum(g.get("state") == "leader" for g in json.load(sys.stdin).get("raft_groups", [])))
' 2>/dev/null) || return 0
    out+=("$n")
  done
  echo "${out[*]}"
}

# Sum over groups of the highest `current_term` any node reports (nothing on a single node):
# its growth over a run counts the elections during it.
terms() {
  [[ $1 == cluster-* ]] || return 0
  local t=0 n
  for p in "${PS[@]}"; do
    n=$(curl -sf --max-time 2 "http://127.0.0.1:$p/__ursula/metrics" | python3 -c '
import json, sys
print(" ".join("%d:%d" % (g["raft_group_id"], g.get("current_term") or 0)
               for g in json.load(sys.stdin).get("raft_groups", [])))' 2>/dev/null) || continue
    t="$t $n"
  done
  python3 -c '
import sys
m = {}
for x in sys.argv[1].split()[1:]:
    g, t = x.split(":")
    m[g] = max(m.get(g, 0), int(t))
print(sum(m.values()))' "$t"
}

# Waits (at most 60 s) until the N groups have leaders spread within one across the nodes,
# twice in a row 0.5 s apart; sets SPREAD. Goes on (with a note) if they never are.
wait_spread() {
  local want=$1 prev= cur
  for _ in $(seq 1 120); do
    cur=$(leaders_per_node)
    if [[ -n $cur ]] && python3 -c '
import sys
c = [int(x) for x in sys.argv[2].split()]
sys.exit(0 if sum(c) == int(sys.argv[1]) and max(c) - min(c) <= 1 else 1)' "$want" "$cur"; then
      [[ $cur == "$prev" ]] && { SPREAD=$cur; return 0; }
      prev=$cur
    else
      prev=
    fi
    sleep 0.5
  done
  SPREAD=$cur
  echo "leaderships not spread after 60 s: $cur" >&2
}

# Moves every group's leadership to node 1 (the transfer route on the admin plane, ports
# APS, of the group's leader), at most 60 s; sets SPREAD.
lead_on_node1() {
  local want=$1 cur
  for _ in $(seq 1 60); do
    cur=$(leaders_per_node)
    [[ $cur == "$want 0 0" ]] && { SPREAD=$cur; return 0; }
    curl -sf --max-time 2 "http://127.0.0.1:${PS[0]}/__ursula/metrics" | python3 -c '
import json, sys
for g in json.load(sys.stdin).get("raft_groups", []):
    if g.get("current_leader") not in (None, 1):
        print(g["raft_group_id"], g["current_leader"])' | while read -r g l; do
      curl -sf --max-time 15 -o /dev/null -X POST \
        "http://127.0.0.1:${APS[$((l - 1))]}/__ursula/raft/$g/leader/transfer/1" || true
    done
    sleep 1
  done
  SPREAD=$cur
  echo "node 1 does not lead every group after 60 s: $cur" >&2
}

# The 3-node config with $1 groups in $TMP/cluster.toml, the balancer checking every $2.
cluster_config() {
  {
    printf 'group_count = %d\n[server]\ncluster_id = "bench"\n[raft]\ninit_membership_per_group = true\n' "$1"
    if [[ -n ${RAFT_EXTRA:-} ]]; then printf '%s\n' "$RAFT_EXTRA"; fi
    printf '[governance.leadership_balance]\ninterval = "%s"\n' "$2"
    printf '[storage.cold]\nbackend = "local"\n[storage.cold.local]\npath = "%s"\nshared = true\n' "$TMP/cold"
    for i in 0 1 2; do
      printf '[[raft.peers]]\nnode_id = %d\nurl = "http://127.0.0.1:%s"\n' $((i + 1)) "${PS[$i]}"
    done
  } >"$TMP/cluster.toml"
}

# Starts a config; sets URL, LEADER_PID (the node the generator is pointed at) and SPREAD.
start() {
  TMP=$(mktemp -d) SPREAD=
  case $1 in
    single|single-g*)
      read -r P < <(ports 1)
      local g=()
      [[ $1 == single-g* ]] && g=(--group-count "${1#single-g}")
      NO_COLOR=1 "${SRV[@]}" "$BIN/ursula" server --listen "127.0.0.1:$P" --data-dir "$TMP/d" \
        "${g[@]}" 2>"$TMP/node.log" &
      PIDS+=($!)
      wait_ready "$P"
      URL=http://127.0.0.1:$P LEADER_PID=${PIDS[0]}
      ;;
    cluster-g*)
      local groups=${1#cluster-g} on1=
      [[ $groups == *-on1 ]] && { groups=${groups%-on1} on1=1; }
      read -r -a PS < <(ports 3)
      read -r -a APS < <(ports 3)
      local admin=()
      if [[ -n $on1 ]]; then cluster_config "$groups" 0s; else cluster_config "$groups" 1s; fi
      for i in 0 1 2; do
        [[ -n $on1 ]] && admin=(--admin-listen "127.0.0.1:${APS[$i]}")
        NO_COLOR=1 "${SRV[@]}" "$BIN/ursula" server --config "$TMP/cluster.toml" --node-id $((i + 1)) \
          --listen "127.0.0.1:${PS[$i]}" "${admin[@]}" --data-dir "$TMP/n$i" 2>"$TMP/n$i.log" &
        PIDS+=($!)
      done
      for p in "${PS[@]}"; do wait_ready "$p"; done
      if [[ -n $on1 ]]; then
        lead_on_node1 "$groups"
        URL=http://127.0.0.1:${PS[0]} LEADER_PID=${PIDS[0]}
        return 0
      fi
      if [[ $groups != 1 ]]; then
        wait_spread "$groups"
        URL=http://127.0.0.1:${PS[0]} LEADER_PID=${PIDS[0]}
        return 0
      fi
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
    for config in "${CONFIGS[@]}"; do
      start "$config"
      terms_before=$(terms "$config")
      before=$(cpu_ticks)
      # shellcheck disable=SC2086  # the preset is a word list
      line=$("${GENPIN[@]}" "$BIN/ursula-bench" "${GEN[@]}" --quiet --url "$URL" $preset \
        --duration "$DURATION" --warmup 1s --server-pid "$LEADER_PID")
      ticks=$(($(cpu_ticks) - before))
      terms_after=$(terms "$config")
      elections=
      [[ -n $terms_before && -n $terms_after ]] && elections=$((terms_after - terms_before))
      printf '%s\n' "$line" | SPREAD=$SPREAD ELECTIONS=$elections python3 -c '
import json, os, sys
r = json.loads(sys.stdin.readline())
r["config"], r["round"] = sys.argv[1], int(sys.argv[2])
if os.environ.get("SPREAD"):
    r["leaders_per_node"] = [int(x) for x in os.environ["SPREAD"].split()]
if os.environ.get("ELECTIONS"):
    r["term_changes"] = int(os.environ["ELECTIONS"])
# CPU of every node over the whole generator run (setup and warm-up too), per append of the
# run (appends/s x (warm-up + measured window)): an upper bound, comparable across configs.
ops = r["appends_per_s"] * (r["duration_s"] + 1.0)
r["all_nodes_cpu_us_per_append"] = int(sys.argv[3]) * 10_000 / ops if ops else None
print(json.dumps(r))
lat, cpu = r["latency"], r.get("server_cpu") or {}
shape = "%sx%s%s" % (r["streams"], r["connections"], " producer" if r["producer"] else "")
print("%-11s r%s %-16s %8.0f/s p50 %8.0f us p99 %8.0f us cpu/append %s us errors %s redirects %s leaders %s terms+%s" % (
    sys.argv[1], sys.argv[2], shape, r["appends_per_s"], lat["p50_us"], lat["p99_us"],
    cpu.get("us_per_op"), r["errors"], r.get("redirects"), r.get("leaders_per_node"), r.get("term_changes")), file=sys.stderr)' "$config" "$round" "$ticks"
      stop_all
    done
  done
done
