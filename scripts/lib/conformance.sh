# Shared by scripts/test.sh and scripts/conformance-cluster.sh: finding and running the
# official conformance suite. Source it; it defines functions only.

# Prints the suite's directory (URSULA_CONFORMANCE_DIR, else ../shared/conformance beside the
# repository or /work/shared/conformance); fails when there is none.
conformance_dir() {
  local root=$1 d
  for d in ${URSULA_CONFORMANCE_DIR:-} "$root/../shared/conformance" /work/shared/conformance; do
    [[ -x $d/run-conformance.sh ]] && { echo "$d"; return 0; }
  done
  echo "conformance suite not found (set URSULA_CONFORMANCE_DIR)" >&2
  return 1
}

# Runs the suite in $1 against $2, its output teed to $3. Sets LINE (the summary line) and
# SKIPPED; succeeds when the suite passed with failed=0 and at least 332 tests passed.
run_conformance() {
  local dir=$1 url=$2 out=$3 rc passed failed
  set +e
  "$dir/run-conformance.sh" "$url" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  LINE=$(grep '^CONFORMANCE ' "$out" | tail -n1)
  passed=$(sed -n 's/.* passed=\([0-9]*\).*/\1/p' <<<"$LINE")
  failed=$(sed -n 's/.* failed=\([0-9]*\).*/\1/p' <<<"$LINE")
  SKIPPED=$(sed -n 's/.* skipped=\([0-9]*\).*/\1/p' <<<"$LINE")
  [[ $rc -eq 0 && ${failed:-1} -eq 0 && ${passed:-0} -ge 332 ]]
}
