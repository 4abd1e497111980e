#!/usr/bin/env bash
# End-to-end checks of the kiln-ops binary: verdict lines, exit codes, budget refusals, JSON.
# usage: kiln_ops_cli.sh <path to kiln-ops> <path to libkiln_fake_cuda.so> <path to libkiln_fake_hip.so>
set -u
ops="$1"
fake_cuda="$2"
fake_hip="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
check() {  # check <description> <command...>: the command must succeed
  local what="$1"; shift
  if "$@"; then echo "ok - $what"; else echo "not ok - $what"; failures=$((failures + 1)); fi
}

# The default cpu run, capped at 16 MiB arrays to keep CI short (make run does the full one).
"$ops" --max-array-mb 16 > "$tmp/cpu.txt" 2>&1; rc=$?
check "cpu run exits 0" test "$rc" -eq 0
check "cpu run prints at least 40 OK verdicts" test "$(grep -c ': OK$' "$tmp/cpu.txt")" -ge 40
check "cpu run prints the summary" grep -Eq '^[0-9]+/[0-9]+ cases OK, 0 refused, 0 failed$' "$tmp/cpu.txt"
check "cpu run prints peak memory per category" grep -q '^peak memory per category: ndarray' "$tmp/cpu.txt"

# A 64 MiB budget: the 256 MiB cases are refused by the budget, the rest OK, exit 0.
"$ops" --budget-mb 64 --filter '/(f32|i32)/(tiny|large)' > "$tmp/b64.txt" 2>&1; rc=$?
check "budget run exits 0" test "$rc" -eq 0
check "large cases REFUSED BudgetExceededError naming bytes and budget" \
  grep -Eq '^axpy/f32/large: REFUSED BudgetExceededError: cpu could not allocate 256.00 MiB .*budget 64.00 MiB' "$tmp/b64.txt"
check "tiny cases OK under the budget" grep -q '^axpy/f32/tiny: OK$' "$tmp/b64.txt"
check "a budget refusal advises kiln-ops' own flag and KILN_POOL_LIMIT_MB" \
  grep -Eq '^axpy/f32/large: REFUSED .*raise the budget \(--budget-mb or KILN_POOL_LIMIT_MB\)' "$tmp/b64.txt"
check "no refusal advises another interface's knob" \
  bash -c "! grep -Eq 'kiln.init|BudgetConfig|ExecutorConfig' '$tmp/b64.txt'"
check "no FAIL under the budget" bash -c "! grep -q ': FAIL' '$tmp/b64.txt'"

# KILN_POOL_LIMIT_MB gives the same refusals.
KILN_POOL_LIMIT_MB=32 "$ops" --filter 'fill/f32/large' > "$tmp/env.txt" 2>&1
check "KILN_POOL_LIMIT_MB=32 refuses by budget" grep -q 'REFUSED BudgetExceededError' "$tmp/env.txt"

# Repetitions on mock under a 32 MiB budget: identical verdicts each time, some of them refusals.
"$ops" --backend mock --budget-mb 32 --repeat 4 > "$tmp/rep.txt" 2>&1; rc=$?
check "mock --repeat 4 exits 0" test "$rc" -eq 0
grep -E ': (OK|FAIL|REFUSED)' "$tmp/rep.txt" | sed -E 's/(REFUSED [A-Za-z]+).*/\1/' > "$tmp/verdicts.txt"
n=$(( $(wc -l < "$tmp/verdicts.txt") / 4 ))
for r in 1 2 3; do
  check "repetition $((r + 1)) has the verdicts of the first" \
    cmp -s <(sed -n "1,${n}p" "$tmp/verdicts.txt") <(sed -n "$((r * n + 1)),$(((r + 1) * n))p" "$tmp/verdicts.txt")
done
check "the 32 MiB budget refuses some mock cases" grep -q 'REFUSED BudgetExceededError' "$tmp/verdicts.txt"

# Faults on mock: a sample of K over a clean run never crashes and refuses exactly one case.
"$ops" --backend mock --max-array-mb 1 > "$tmp/mock.txt" 2>&1
allocs=$(sed -n 's/^allocations: //p' "$tmp/mock.txt")
check "mock clean run reports its allocation count" test -n "$allocs"
for k in 1 2 3 $((allocs / 3)) $((allocs / 2)) $((allocs - 1)) "$allocs"; do
  "$ops" --backend mock --max-array-mb 1 --fault-at "$k" > "$tmp/fault.txt" 2>&1; rc=$?
  check "fault-at $k exits 0 (no crash)" test "$rc" -eq 0
  check "fault-at $k refuses exactly one case with DeviceOutOfMemoryError" \
    test "$(grep -c 'REFUSED DeviceOutOfMemoryError' "$tmp/fault.txt")" -eq 1
done

# Heap too small: DeviceHeapExhaustedError, and the following case still runs.
"$ops" --heap-mb 0 --filter 'compact_heap/f32/small|fill/i64/tiny' > "$tmp/heap.txt" 2>&1
check "heap exhaustion is REFUSED DeviceHeapExhaustedError" grep -q '^compact_heap/f32/small: REFUSED DeviceHeapExhaustedError' "$tmp/heap.txt"
check "the next case after heap exhaustion is OK" grep -q '^fill/i64/tiny: OK$' "$tmp/heap.txt"
check "heap exhaustion advises --heap-mb" \
  grep -Eq '^compact_heap/f32/small: REFUSED .*raise the device heap \(--heap-mb\)' "$tmp/heap.txt"

# Usage errors exit 2; --list and --json work.
"$ops" --backend tpu > /dev/null 2>&1; check "unknown backend exits 2" test $? -eq 2
"$ops" --repeat zero > /dev/null 2>&1; check "non-numeric value exits 2" test $? -eq 2
"$ops" --filter '(' > /dev/null 2>&1; check "bad regex exits 2" test $? -eq 2
"$ops" --filter 'no-such-case' > /dev/null 2>&1; check "a filter matching no case exits 2" test $? -eq 2
"$ops" --bogus 1 2> "$tmp/bogus.txt"; check "an unknown option is named" grep -q 'unknown option --bogus' "$tmp/bogus.txt"
"$ops" --bogus 2> "$tmp/bogus2.txt"; check "an unknown option without a value is named" grep -q 'unknown option --bogus' "$tmp/bogus2.txt"
"$ops" --json /nonexistent/dir/x.json > /dev/null 2>&1; check "an unwritable --json path exits 2 before the run" test $? -eq 2
check "--list honours --filter" test "$("$ops" --list --filter '^fill/f32/' | wc -l)" -eq 4
check "--list prints case names" bash -c "'$ops' --list | grep -q '^matmul/f64/odd$'"
"$ops" --filter 'reduce_sum/i32/tiny' --json "$tmp/out.json" > /dev/null 2>&1
check "--json writes the verdicts" grep -q '"name": "reduce_sum/i32/tiny", "verdict": "OK"' "$tmp/out.json"

# Hostile command lines (issue 11, section 5): every bad value is a usage error (exit 2) with a
# message, never a crash; RE2 matches --filter in linear time without recursion.
deep=$(printf '(%.0s' $(seq 50000))fill/f32/tiny$(printf ')%.0s' $(seq 50000))
"$ops" --filter "$deep" --list > "$tmp/deep.txt" 2> "$tmp/deep_err.txt"; rc=$?
check "a filter nested 50000 deep does not crash (exit $rc)" test "$rc" -eq 0
check "a filter nested 50000 deep still matches" test "$(cat "$tmp/deep.txt")" = "fill/f32/tiny"
"$ops" --filter '(a*)*b{2,1}' --list > /dev/null 2> "$tmp/re.txt"; rc=$?
check "an invalid RE2 filter exits 2 with RE2's reason" test "$rc" -eq 2
check "an invalid RE2 filter is named" grep -q 'is not a valid regex' "$tmp/re.txt"
"$ops" --json "" --filter fill/f32/tiny > /dev/null 2> "$tmp/json_empty.txt"; rc=$?
check "--json with an empty path exits 2 before the run" test "$rc" -eq 2
check "--json with an empty path says so" grep -q -- '--json needs a file name' "$tmp/json_empty.txt"
"$ops" --json - --filter fill/f32/tiny > "$tmp/json_stdout.txt" 2> "$tmp/json_stderr.txt"; rc=$?
check "--json - exits 0" test "$rc" -eq 0
check "--json - writes the JSON alone to stdout" /usr/bin/python3 -c \
  'import json, sys; d = json.load(open(sys.argv[1])); assert d["cases"][0]["name"] == "fill/f32/tiny"' \
  "$tmp/json_stdout.txt"
check "--json - sends the verdict lines to stderr" grep -q 'fill/f32/tiny: OK' "$tmp/json_stderr.txt"
check "--json - makes no file named -" test ! -e ./-
"$ops" --json - --filter fill/f32/tiny > /dev/full 2> /dev/null; rc=$?
check "--json - into a full stdout exits 1 (got $rc)" test "$rc" -eq 1
for args in "--bogus" "--budget-mb x --list" "--json"; do
  # shellcheck disable=SC2086
  "$ops" $args > /dev/null 2> /dev/full; rc=$?
  check "a usage error with a full stderr still exits 2 (kiln-ops $args, got $rc)" test "$rc" -eq 2
done
for args in "--filter fill/f32/tiny" "--list" "--help"; do
  # shellcheck disable=SC2086
  "$ops" $args > /dev/full 2> "$tmp/full.txt"; rc=$?
  check "kiln-ops $args into a full stdout exits non-zero (got $rc)" test "$rc" -ne 0
  check "kiln-ops $args into a full stdout says so on stderr" grep -q 'could not write the results to stdout' "$tmp/full.txt"
done
"$ops" --budget-mb 64 --budget-mb 32 --list > /dev/null 2> "$tmp/twice.txt"; rc=$?
check "a repeated option exits 2" test "$rc" -eq 2
check "a repeated option is named" grep -q -- '--budget-mb is given more than once' "$tmp/twice.txt"
"$ops" --list --list > /dev/null 2>&1; check "a repeated --list exits 2" test $? -eq 2
for flag in --budget-mb --heap-mb --max-array-mb --mock-capacity-mb --repeat --fault-at --threads; do
  for value in -1 abc "" 1.5 +3 0x10 18446744073709551616 99999999999999999999999; do
    "$ops" "$flag" "$value" --list > /dev/null 2> "$tmp/bad.txt"; rc=$?
    check "$flag '$value' exits 2" test "$rc" -eq 2
  done
  "$ops" "$flag" > /dev/null 2> "$tmp/missing.txt"; rc=$?
  check "$flag without a value exits 2" test "$rc" -eq 2
  check "$flag without a value says so" grep -q -- "$flag needs a value" "$tmp/missing.txt"
  "$ops" "$flag" --list > /dev/null 2>&1; check "$flag followed by an option exits 2" test $? -eq 2
done
for flag in --budget-mb --heap-mb --max-array-mb --mock-capacity-mb; do
  "$ops" "$flag" 17592186044416 --list > /dev/null 2>&1  # 2**44 MiB = 2**64 bytes
  check "$flag beyond 2**64 bytes exits 2" test $? -eq 2
done
"$ops" --repeat 0 --list > /dev/null 2>&1; check "--repeat 0 exits 2" test $? -eq 2
"$ops" --threads 5000 --list > /dev/null 2>&1; check "--threads 5000 exits 2" test $? -eq 2
for flag in --backend --filter --json; do
  "$ops" "$flag" > /dev/null 2>&1; check "$flag without a value exits 2" test $? -eq 2
done
"$ops" --backend "" --list > /dev/null 2>&1; check "an empty --backend exits 2" test $? -eq 2

# CUDA against the fake driver: every case OK; without a driver: NotSupportedError, exit 1.
KILN_CUDA_DRIVER="$fake_cuda" "$ops" --backend cuda --max-array-mb 4 > "$tmp/cuda.txt" 2>&1; rc=$?
check "cuda on the fake driver exits 0" test "$rc" -eq 0
check "cuda on the fake driver: all cases OK" grep -Eq '^[0-9]+/[0-9]+ cases OK, 0 refused, 0 failed$' "$tmp/cuda.txt"
KILN_CUDA_DRIVER=/nonexistent/libcuda.so.1 "$ops" --backend cuda > "$tmp/nocuda.txt" 2>&1; rc=$?
check "cuda without a driver exits 1" test "$rc" -eq 1
check "cuda without a driver is NotSupportedError naming the library" \
  grep -q 'NotSupportedError: .*/nonexistent/libcuda.so.1' "$tmp/nocuda.txt"
KILN_CUDA_DRIVER="$fake_cuda" KILN_FAKE_CUDA_MODE=stub "$ops" --backend cuda > "$tmp/stub.txt" 2>&1
check "cuda with a stub driver is NotSupportedError naming CUDA_ERROR_STUB_LIBRARY" \
  grep -q 'NotSupportedError: .*CUDA_ERROR_STUB_LIBRARY' "$tmp/stub.txt"

# AMDGPU against the fake HIP runtime: every case OK; an injected hipErrorOutOfMemory is refused
# by name; without a runtime, and on this machine's real HIP runtime (Debian's libamdhip64, which
# finds no GPU): NotSupportedError carrying the runtime's own answer, exit 1, no crash.
KILN_HIP_RUNTIME="$fake_hip" "$ops" --backend amdgpu --max-array-mb 4 > "$tmp/amdgpu.txt" 2>&1; rc=$?
check "amdgpu on the fake HIP runtime exits 0" test "$rc" -eq 0
check "amdgpu on the fake HIP runtime: all cases OK" grep -Eq '^[0-9]+/[0-9]+ cases OK, 0 refused, 0 failed$' "$tmp/amdgpu.txt"
check "amdgpu on the fake HIP runtime: at least 40 OK verdicts" test "$(grep -c ': OK$' "$tmp/amdgpu.txt")" -ge 40
KILN_HIP_RUNTIME="$fake_hip" KILN_FAKE_HIP_FAULTS=hipMalloc@5=hipErrorOutOfMemory \
  "$ops" --backend amdgpu --max-array-mb 1 > "$tmp/amdgpu_oom.txt" 2>&1; rc=$?
check "amdgpu with an injected hipErrorOutOfMemory exits 0" test "$rc" -eq 0
check "amdgpu with an injected hipErrorOutOfMemory refuses one case by name" \
  grep -q 'REFUSED DeviceOutOfMemoryError: .*hipErrorOutOfMemory' "$tmp/amdgpu_oom.txt"
KILN_HIP_RUNTIME=/nonexistent/libamdhip64.so "$ops" --backend amdgpu > "$tmp/nohip.txt" 2>&1; rc=$?
check "amdgpu without a HIP runtime exits 1" test "$rc" -eq 1
check "amdgpu without a HIP runtime is NotSupportedError naming the library" \
  grep -q 'NotSupportedError: .*/nonexistent/libamdhip64.so' "$tmp/nohip.txt"
if ldconfig -p 2>/dev/null | grep -q 'libamdhip64\.so'; then
  env -u KILN_HIP_RUNTIME "$ops" --backend amdgpu > "$tmp/realhip.txt" 2>&1; rc=$?
  check "amdgpu on the real HIP runtime without a GPU exits 1 (not a crash)" test "$rc" -eq 1
  check "amdgpu on the real HIP runtime is NotSupportedError with the runtime's hipError answer" \
    grep -Eq 'NotSupportedError: .*hipError(NoDevice|InvalidDevice|InsufficientDriver|NotInitialized)' "$tmp/realhip.txt"
else
  echo "ok - SKIP real HIP runtime: libamdhip64 is not installed (scripts/install-deps.sh installs it)"
fi

# On a terminal (test/e2e/tty_screen.py runs kiln-ops on a pseudo-terminal), the progress line is
# blanked before each verdict and the summary: the screen shows the verdict lines and the summary
# alone, nothing left over from "[i/M] case".
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
$py "$here/tty_screen.py" 120 "$ops" --filter '^(axpy_staged/f32/medium|fill/f32/tiny|copy/f32/tiny|fill/i64/tiny)$' \
  > "$tmp/tty.txt" 2>&1; rc=$?
check "kiln-ops on a terminal exits 0 (got $rc)" test "$rc" -eq 0
$py "$here/tty_screen.py" --raw 120 "$ops" --filter '^fill/f32/tiny$' > "$tmp/tty_raw.txt" 2>&1
check "on a terminal, the progress line is drawn (else the next checks prove nothing)" \
  grep -qF '[1/1] fill/f32/tiny\r' "$tmp/tty_raw.txt"
check "on a terminal, the verdict lines show nothing of the progress line" \
  test "$(grep -cE '^(axpy_staged/f32/medium|fill/f32/tiny|copy/f32/tiny|fill/i64/tiny): OK$' "$tmp/tty.txt")" -eq 4
check "on a terminal, nothing but verdicts, the summary and figures remain" \
  bash -c "! grep -vE '^([a-z_]+/[a-z0-9]+/[a-z]+: OK|4/4 cases OK, 0 refused, 0 failed|peak memory per category: .*|allocations: [0-9]+)$' '$tmp/tty.txt'"

if [ "$failures" -ne 0 ]; then echo "kiln_ops_cli: $failures check(s) failed"; exit 1; fi
echo "kiln_ops_cli: all checks passed"
