#!/usr/bin/env bash
# End-to-end checks of the kiln-ops binary: verdict lines, exit codes, budget refusals, JSON,
# JUnit XML, the progress line on a terminal (test/e2e/tty_screen.py).
# usage: kiln_ops_cli.sh <path to kiln-ops> <path to libkiln_fake_cuda.so> <path to libkiln_fake_hip.so>
set -u
ops="$1"
fake_cuda="$2"
fake_hip="$3"
tmp=$(mktemp -d)
py=/usr/bin/python3
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

# --fault SPEC (issue 14): the first ndarray request fails, refusing exactly one case as
# --fault-at does; KILN_FAULT does the same for an unmodified command line; bad specs exit 2.
"$ops" --backend mock --max-array-mb 1 --fault nth=1,category=ndarray > "$tmp/spec.txt" 2>&1; rc=$?
check "--fault nth=1,category=ndarray exits 0 (no crash)" test "$rc" -eq 0
check "--fault nth=1,category=ndarray refuses exactly one case with DeviceOutOfMemoryError" \
  test "$(grep -c 'REFUSED DeviceOutOfMemoryError' "$tmp/spec.txt")" -eq 1
check "--fault nth=1,category=ndarray: no case FAILs" bash -c "! grep -q ': FAIL' '$tmp/spec.txt'"
KILN_FAULT=nth=1,category=ndarray "$ops" --backend mock --max-array-mb 1 > "$tmp/spec_env.txt" 2>&1
check "KILN_FAULT gives the verdicts --fault gives" cmp -s "$tmp/spec.txt" "$tmp/spec_env.txt"
"$ops" --backend mock --max-array-mb 1 --fault min_bytes=1B > "$tmp/spec_all.txt" 2>&1; rc=$?
check "--fault min_bytes=1B refuses every allocating case, exit 0" test "$rc" -eq 0
check "--fault min_bytes=1B: no case OK or FAIL" bash -c "! grep -Eq ': (OK|FAIL)' '$tmp/spec_all.txt'"
# The other fault kinds: an injected launch fault is not an answer the suite accepts (as any
# error other than out-of-memory or a lost device): the axpy cases FAIL RuntimeFaultError naming
# the kernel, exit 1, every other case OK; a lost device REFUSES every case, exit 0.
"$ops" --backend mock --max-array-mb 1 --fault kind=launch,kernel=axpy > "$tmp/launch.txt" 2>&1; rc=$?
check "--fault kind=launch,kernel=axpy exits 1 (cases FAIL)" test "$rc" -eq 1
check "--fault kind=launch,kernel=axpy: axpy FAILs RuntimeFaultError, an injected launch fault" \
  grep -Eq '^axpy/f32/tiny: FAIL RuntimeFaultError: mock: launch of kernel kiln_axpy_f32 failed: injected launch fault' "$tmp/launch.txt"
check "--fault kind=launch,kernel=axpy: staged axpy FAILs too" grep -q '^axpy_staged/f64/small: FAIL RuntimeFaultError' "$tmp/launch.txt"
check "--fault kind=launch,kernel=axpy: only axpy cases FAIL" \
  bash -c "! grep ': FAIL' '$tmp/launch.txt' | grep -vq '^axpy'"
check "--fault kind=launch,kernel=axpy: the other kernels are OK" grep -q '^fill/f32/tiny: OK$' "$tmp/launch.txt"
"$ops" --backend mock --max-array-mb 1 --fault kind=lost,nth=1 > "$tmp/lost.txt" 2>&1; rc=$?
check "--fault kind=lost,nth=1 exits 0 (no crash)" test "$rc" -eq 0
check "--fault kind=lost,nth=1: the first request loses the device, injected" \
  grep -q '^allocate/f32/tiny: REFUSED DeviceLostError: mock: injected device loss' "$tmp/lost.txt"
check "--fault kind=lost,nth=1: later cases fail fast" \
  grep -q '^matmul/i64/odd: REFUSED DeviceLostError: mock: the device was lost earlier' "$tmp/lost.txt"
check "--fault kind=lost,nth=1: every case REFUSED" grep -q '^0/84 cases OK, 84 refused, 0 failed' "$tmp/lost.txt"
for spec in nth=0 nth=1,nth=2 p=2 seed=1 when=3 kind=gone kind=launch,category=staging kernel=nosuch category=gpu ""; do
  "$ops" --fault "$spec" --list > /dev/null 2> "$tmp/badspec.txt"; rc=$?
  check "--fault '$spec' exits 2" test "$rc" -eq 2
  check "--fault '$spec' says what is wrong" grep -Eq -- "--fault( needs|: fault spec)" "$tmp/badspec.txt"
done
check "a bad --fault names the term and the grammar" grep -q "term 'category=gpu' names no memory category; grammar:" \
  <("$ops" --fault category=gpu --list 2>&1)
"$ops" --fault nth=1 --fault-at 2 --list > /dev/null 2> "$tmp/both.txt"; rc=$?
check "--fault with --fault-at exits 2" test "$rc" -eq 2
check "--fault with --fault-at says so" grep -q -- '--fault and --fault-at cannot both be given' "$tmp/both.txt"
KILN_FAULT=nth=zero "$ops" --list > /dev/null 2> "$tmp/badenv.txt"; rc=$?
check "a malformed KILN_FAULT exits 2" test "$rc" -eq 2
check "a malformed KILN_FAULT is named" grep -q "KILN_FAULT: fault spec 'nth=zero'" "$tmp/badenv.txt"

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
"$ops" --filter 'no-such-case' > /dev/null 2> "$tmp/nomatch.txt"
check "a filter matching no case is named as the reason" grep -q "no case matches --filter 'no-such-case'" "$tmp/nomatch.txt"
"$ops" --max-array-mb 0 > /dev/null 2> "$tmp/nofit.txt"; rc=$?
check "a size cap that fits no case exits 2 (exit $rc)" test "$rc" -eq 2
check "a size cap that fits no case is named, not the filter" grep -q "no case fits --max-array-mb 0" "$tmp/nofit.txt"
check "... and not blamed on --filter" bash -c "! grep -q -- '--filter' '$tmp/nofit.txt'"
"$ops" --bogus 1 2> "$tmp/bogus.txt"; check "an unknown option is named" grep -q 'unknown option --bogus' "$tmp/bogus.txt"
"$ops" --bogus 2> "$tmp/bogus2.txt"; check "an unknown option without a value is named" grep -q 'unknown option --bogus' "$tmp/bogus2.txt"
"$ops" --json /nonexistent/dir/x.json > "$tmp/nojson.txt" 2>&1; rc=$?
check "an unwritable --json path exits 2 before the run" test "$rc" -eq 2
check "an unwritable --json path is named with the reason" \
  grep -q -- '--json /nonexistent/dir/x.json: cannot write there (No such file or directory)' "$tmp/nojson.txt"
check "an unwritable --json path: no case ran" bash -c "! grep -q ': OK' '$tmp/nojson.txt'"
check "--list honours --filter" test "$("$ops" --list --filter '^fill/f32/' | wc -l)" -eq 4
check "--list prints case names" bash -c "'$ops' --list | grep -q '^matmul/f64/odd$'"
"$ops" --filter 'reduce_sum/i32/tiny' --json "$tmp/out.json" > /dev/null 2>&1
check "--json writes the verdicts" /usr/bin/python3 -c \
  'import json, sys; c = json.load(open(sys.argv[1]))["cases"]; assert [(x["name"], x["status"]) for x in c] == [("reduce_sum/i32/tiny", "ok")], c' \
  "$tmp/out.json"

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
"$ops" --json - --filter fill/f32/tiny > /dev/full 2> "$tmp/json_full.txt"; rc=$?
check "--json - into a full stdout exits 1 (got $rc)" test "$rc" -eq 1
check "--json - into a full stdout says so once, prefixed once" test \
  "$(grep -c 'stdout' "$tmp/json_full.txt")" -eq 1 -a "$(grep -c 'kiln-ops: kiln-ops' "$tmp/json_full.txt")" -eq 0
check "--json - into a full stdout names the reason" grep -q '^kiln-ops: cannot write stdout (' "$tmp/json_full.txt"
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
for flag in --backend --filter --json --fault; do
  "$ops" "$flag" > /dev/null 2>&1; check "$flag without a value exits 2" test $? -eq 2
done
"$ops" --backend "" --list > /dev/null 2>&1; check "an empty --backend exits 2" test $? -eq 2

# CUDA against the fake driver: every case OK; without a driver: NotSupportedError, exit 77
# (the backend is not available here: "skipped", not "broken").
KILN_CUDA_DRIVER="$fake_cuda" "$ops" --backend cuda --max-array-mb 4 > "$tmp/cuda.txt" 2>&1; rc=$?
check "cuda on the fake driver exits 0" test "$rc" -eq 0
check "cuda on the fake driver: all cases OK" grep -Eq '^[0-9]+/[0-9]+ cases OK, 0 refused, 0 failed$' "$tmp/cuda.txt"
# A refusal whose device memory query failed (the driver's 3rd cuMemGetInfo_v2: the first two are
# the set-up's) has null device figures in the JSON, not 0 B free.
KILN_CUDA_DRIVER="$fake_cuda" KILN_FAKE_CUDA_FAULTS=cuMemGetInfo_v2@3=999 "$ops" --backend cuda \
  --budget-mb 24 --filter 'fill/f32/large' --json "$tmp/unread.json" > /dev/null 2>&1
check "a refusal whose memory query failed has null device figures in the JSON" $py -c \
  'import json, sys; e = json.load(open(sys.argv[1]))["cases"][0]["error"]; m = e["memory"]
assert e["name"] == "BudgetExceededError" and "free memory could not be read" in e["message"], e
assert m["limit_bytes"] == 24 << 20 and [m["free_bytes"], m["total_bytes"], m["live_age_ms"]] == [None] * 3, m' \
  "$tmp/unread.json"
KILN_CUDA_DRIVER=/nonexistent/libcuda.so.1 "$ops" --backend cuda > "$tmp/nocuda.txt" 2>&1; rc=$?
check "cuda without a driver exits 77 (backend unavailable)" test "$rc" -eq 77
check "cuda without a driver says the backend is not available here" \
  grep -q 'kiln-ops: the cuda backend is not available here: NotSupportedError' "$tmp/nocuda.txt"
check "cuda without a driver is NotSupportedError naming the library" \
  grep -q 'NotSupportedError: .*/nonexistent/libcuda.so.1' "$tmp/nocuda.txt"
KILN_CUDA_DRIVER="$fake_cuda" KILN_FAKE_CUDA_MODE=stub "$ops" --backend cuda > "$tmp/stub.txt" 2>&1; rc=$?
check "cuda with a stub driver exits 77 (backend unavailable)" test "$rc" -eq 77
check "cuda with a stub driver is NotSupportedError naming CUDA_ERROR_STUB_LIBRARY" \
  grep -q 'NotSupportedError: .*CUDA_ERROR_STUB_LIBRARY' "$tmp/stub.txt"

# --backend cuda:1 picks the driver's device 1; one it lacks is NotSupportedError naming the count.
KILN_CUDA_DRIVER="$fake_cuda" KILN_FAKE_CUDA_DEVICES=2 "$ops" --backend cuda:1 --max-array-mb 4 \
  --filter '^(fill|axpy)/' --json "$tmp/cuda1.json" --junit "$tmp/cuda1.xml" > "$tmp/cuda1.txt" 2>&1; rc=$?
check "cuda:1 of 2 fake devices exits 0" test "$rc" -eq 0
check "cuda:1's JSON report names the device it ran on" \
  test "$($py -c 'import json,sys; d = json.load(open(sys.argv[1])); print(d["backend"], d["device"])' "$tmp/cuda1.json")" = "cuda cuda:1"
check "cuda:1's JUnit report names the device it ran on" grep -q 'testsuite name="kiln-ops.cuda:1"' "$tmp/cuda1.xml"
check "cuda:1 of 2 fake devices: all cases OK" grep -Eq '^[0-9]+/[0-9]+ cases OK, 0 refused, 0 failed$' "$tmp/cuda1.txt"
KILN_CUDA_DRIVER="$fake_cuda" "$ops" --backend cuda:1 > "$tmp/cuda1of1.txt" 2>&1; rc=$?
check "cuda:1 of 1 device exits 77 (not available here)" test "$rc" -eq 77
check "cuda:1 of 1 device is NotSupportedError naming the device count" \
  grep -q 'NotSupportedError: .*reports 1 device(s)' "$tmp/cuda1of1.txt"
"$ops" --backend cuda:x > "$tmp/badordinal.txt" 2>&1; rc=$?
check "a malformed --backend ordinal exits 2" test "$rc" -eq 2
check "a malformed --backend ordinal is named" grep -q "'cuda:x' is not a device name" "$tmp/badordinal.txt"
"$ops" --backend cpu:1 > "$tmp/cpu1.txt" 2>&1; rc=$?
check "--backend cpu:1 is a usage error, exit 2 (got $rc)" test "$rc" -eq 2
check "--backend cpu:1 says the cpu backend has one device" grep -q 'cpu:1: the cpu backend has one device, cpu:0' "$tmp/cpu1.txt"
 an injected hipErrorOutOfMemory is refused
# by name; without a runtime, and on this machine's real HIP runtime (Debian's libamdhip64, which
# finds no GPU): NotSupportedError carrying the runtime's own answer, exit 77, no crash.
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
check "amdgpu without a HIP runtime exits 77 (backend unavailable)" test "$rc" -eq 77
check "amdgpu without a HIP runtime is NotSupportedError naming the library" \
  grep -q 'NotSupportedError: .*/nonexistent/libamdhip64.so' "$tmp/nohip.txt"
if ldconfig -p 2>/dev/null | grep -q 'libamdhip64\.so'; then
  env -u KILN_HIP_RUNTIME "$ops" --backend amdgpu > "$tmp/realhip.txt" 2>&1; rc=$?
  check "amdgpu on the real HIP runtime without a GPU exits 77 (backend unavailable, not a crash)" test "$rc" -eq 77
  check "amdgpu on the real HIP runtime is NotSupportedError with the runtime's hipError answer" \
    grep -Eq 'NotSupportedError: .*hipError(NoDevice|InvalidDevice|InsufficientDriver|NotInitialized)' "$tmp/realhip.txt"
else
  echo "ok - SKIP real HIP runtime: libamdhip64 is not installed (scripts/install-deps.sh installs it)"
fi

# On a terminal (test/e2e/tty_screen.py runs kiln-ops on a pseudo-terminal), the progress line is
# blanked before each verdict and the summary: the screen shows the verdict lines and the summary
# alone, nothing left over from "[i/M] case".
here=$(cd "$(dirname "$0")" && pwd)
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

# For CI systems (issue 15, item 7): --version, exit statuses, the JSON schema, JUnit XML.
project_version=$(sed -n 's/^project(kiln VERSION \([0-9.]*\).*/\1/p' "$here/../../CMakeLists.txt")
"$ops" --version > "$tmp/version.txt" 2>&1; rc=$?
check "--version exits 0" test "$rc" -eq 0
check "--version prints CMake's project(VERSION) ($project_version)" \
  test "$(cat "$tmp/version.txt")" = "kiln-ops $project_version"
"$ops" --help > "$tmp/help.txt" 2>&1
for word in '--junit PATH' '--version' '^  77 ' '^  2 ' 'KILN_POOL_LIMIT_MB'; do
  check "--help documents '$word'" grep -q -- "$word" "$tmp/help.txt"
done
"$ops" --budget-mb 1 --filter fill/f32/tiny > "$tmp/broken.txt" 2>&1; rc=$?
check "a budget too small for the executor itself exits 1 (broken, not skipped; got $rc)" test "$rc" -eq 1

# A run with OK and REFUSED cases: the JSON's schema fields and the JUnit report agree with it.
"$ops" --budget-mb 64 --filter '/(f32|i32)/(tiny|large)' --json "$tmp/ci.json" --junit "$tmp/ci.xml" \
  > "$tmp/ci.txt" 2>&1; rc=$?
check "a run with --json and --junit exits 0" test "$rc" -eq 0
check "JSON: schema_version, backend, budget, status and per-case structured errors" $py - "$tmp/ci.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["schema_version"] == 1 and d["tool"] == "kiln-ops", d
assert d["backend"] == "cpu" and d["status"] == "passed" and d["exit_status"] == 0, d
assert d["budget"] == {"source": "--budget-mb", "limit_bytes": 64 << 20, "reserve_bytes": d["budget"]["reserve_bytes"]}, d["budget"]
assert d["setup_failure"] is None
s = d["summary"]
assert s["cases"] == len(d["cases"]) == s["ok"] + s["refused"] and s["failed"] == 0 and s["refused"] > 0, s
for c in d["cases"]:
    assert c["status"] in ("ok", "refused") and c["repetition"] == 1, c
    if c["status"] == "ok":
        assert c["error"] is None and c["reason"] is None, c
        continue
    e = c["error"]
    assert e["name"] == "BudgetExceededError" and e["oom_source"] == "budget", e
    assert e["requested_bytes"] >= 256 << 20 and e["category"] in ("ndarray", "staging"), e
    assert e["site"] and e["message"] and e["memory"]["limit_bytes"] == 64 << 20, e
    assert "--budget-mb" in e["advice"], e
PY
check "JUnit: parses, one testcase per case, REFUSED as skipped" $py - "$tmp/ci.xml" "$tmp/ci.json" <<'PY'
import json, sys, xml.etree.ElementTree as ET
root, d = ET.parse(sys.argv[1]).getroot(), json.load(open(sys.argv[2]))
suite = root.find("testsuite")
cases = suite.findall("testcase")
assert [c.get("name") for c in cases] == [c["name"] for c in d["cases"]], cases
assert int(suite.get("tests")) == len(cases) and int(root.get("tests")) == len(cases)
skipped = [c for c in cases if c.find("skipped") is not None]
assert len(skipped) == d["summary"]["refused"] == int(suite.get("skipped")) > 0
assert all("BudgetExceededError" in c.find("skipped").get("message") for c in skipped)
assert suite.get("failures") == "0" and not suite.findall(".//failure")
props = {p.get("name"): p.get("value") for p in suite.find("properties")}
assert props["backend"] == "cpu" and props["budget_limit_bytes"] == str(64 << 20), props
PY
KILN_POOL_LIMIT_MB=32 "$ops" --filter fill/f32/tiny --json - 2> /dev/null > "$tmp/envsrc.json"
check "JSON: a budget from KILN_POOL_LIMIT_MB says so" $py -c \
  'import json, sys; b = json.load(open(sys.argv[1]))["budget"]; assert b["source"] == "KILN_POOL_LIMIT_MB" and b["limit_bytes"] == 32 << 20, b' \
  "$tmp/envsrc.json"
KILN_POOL_LIMIT_MB= "$ops" --filter fill/f32/tiny --json - 2> /dev/null > "$tmp/envempty.json"
check "JSON: an empty KILN_POOL_LIMIT_MB is unset, as the runtime reads it" $py -c \
  'import json, sys; b = json.load(open(sys.argv[1]))["budget"]; assert b["source"] == "device", b' \
  "$tmp/envempty.json"

# A FAIL by a driver error (the fake driver's 1st cuMemcpyDtoH_v2 answers CUDA_ERROR_INVALID_VALUE):
# exit 1; JSON and JUnit name the error, its site and driver status.
KILN_CUDA_DRIVER="$fake_cuda" KILN_FAKE_CUDA_FAULTS=cuMemcpyDtoH_v2@1=1 "$ops" --backend cuda \
  --filter 'fill/f32/(tiny|small)' --json "$tmp/fail.json" --junit "$tmp/fail.xml" > /dev/null 2>&1; rc=$?
check "a FAILed case exits 1 (got $rc)" test "$rc" -eq 1
check "JSON: a FAIL has the error's structured fields" $py - "$tmp/fail.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"] == "failed" and d["exit_status"] == 1 and d["summary"]["failed"] == 1, d["summary"]
c = d["cases"][0]
assert c["name"] == "fill/f32/tiny" and c["status"] == "failed", c
e = c["error"]
assert e["name"] == "RuntimeFaultError" and e["site"] == "cuMemcpyDtoH_v2", e
assert e["driver_status"] == "CUDA_ERROR_INVALID_VALUE" and e["requested_bytes"] is None, e
PY
check "JUnit: a FAIL is a <failure> typed with the kiln error name" $py - "$tmp/fail.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
failures = suite.findall("testcase/failure")
assert suite.get("failures") == "1" and len(failures) == 1, ET.tostring(suite)
assert failures[0].get("type") == "RuntimeFaultError", failures[0].attrib
assert failures[0].get("message").startswith("RuntimeFaultError: "), failures[0].attrib
PY

# Backend unavailable: exit 77, the JSON says backend_unavailable with the NotSupportedError, the
# JUnit skips every case. The driver path carries XML markup and a byte that is no UTF-8: both
# reports still parse (escaped; U+FFFD).
hostile=$'/nonexistent/\xff<&"\'>]]>.so'
ncuda=$("$ops" --backend cuda --list | wc -l)
KILN_CUDA_DRIVER="$hostile" "$ops" --backend cuda --json "$tmp/na.json" --junit "$tmp/na.xml" \
  > /dev/null 2>&1; rc=$?
check "no CUDA driver with --json/--junit exits 77 (got $rc)" test "$rc" -eq 77
check "JSON: backend unavailable, the set-up failure structured" $py - "$tmp/na.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"] == "backend_unavailable" and d["exit_status"] == 77 and d["backend"] == "cuda", d
f = d["setup_failure"]
assert f["name"] == "NotSupportedError" and f["site"] == "dlopen" and f["requested_bytes"] is None, f
assert "/nonexistent/\ufffd<&\"'>]]>.so" in f["message"], f["message"]
assert d["cases"] == [] and d["budget"]["limit_bytes"] is None, d
PY
check "JUnit: backend unavailable, every selected case skipped, markup escaped" \
  $py - "$tmp/na.xml" "$ncuda" <<'PY'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
cases = suite.findall("testcase")
assert len(cases) == int(sys.argv[2]) == int(suite.get("skipped")) > 0, (len(cases), sys.argv[2])
message = cases[0].find("skipped").get("message")
assert message.startswith("backend unavailable: NotSupportedError") and "\ufffd<&\"'>]]>.so" in message, message
PY
KILN_CUDA_DRIVER="$fake_cuda" KILN_FAKE_CUDA_FAULTS='cuInit@*=100' "$ops" --backend cuda \
  --filter fill/f32/tiny > "$tmp/nodev.txt" 2>&1; rc=$?
check "a CUDA driver with no device (CUDA_ERROR_NO_DEVICE) exits 77 (got $rc)" test "$rc" -eq 77

# --junit PATH: checked before any case runs; "-" is stdout; a report that cannot be written
# in the end is status 1 said on stderr.
"$ops" --junit /nonexistent/dir/x.xml --filter fill/f32/tiny > "$tmp/nojunit.txt" 2>&1; rc=$?
check "an unwritable --junit path exits 2 before the run" test "$rc" -eq 2
check "an unwritable --junit path is named with the reason" \
  grep -q -- '--junit /nonexistent/dir/x.xml: cannot write there (No such file or directory)' "$tmp/nojunit.txt"
check "an unwritable --junit path: no case ran" bash -c "! grep -q ': OK' '$tmp/nojunit.txt'"
"$ops" --junit "$tmp" --filter fill/f32/tiny > "$tmp/dirjunit.txt" 2>&1; rc=$?
check "--junit naming a directory exits 2 (got $rc)" test "$rc" -eq 2
check "--junit naming a directory says why" grep -q 'cannot write there (Is a directory)' "$tmp/dirjunit.txt"
"$ops" --junit "" --filter fill/f32/tiny > /dev/null 2> "$tmp/junit_empty.txt"; rc=$?
check "--junit with an empty path exits 2" test "$rc" -eq 2
check "--junit with an empty path says so" grep -q -- '--junit needs a file name' "$tmp/junit_empty.txt"
"$ops" --junit > /dev/null 2>&1; check "--junit without a value exits 2" test $? -eq 2
"$ops" --junit "$tmp/same" --json "$tmp/same" --filter fill/f32/tiny > /dev/null 2>&1; rc=$?
check "--json and --junit to one file exits 2" test "$rc" -eq 2
"$ops" --junit "$tmp/a.xml" --junit "$tmp/b.xml" --filter fill/f32/tiny > /dev/null 2>&1; rc=$?
check "a repeated --junit exits 2" test "$rc" -eq 2
"$ops" --junit - --filter fill/f32/tiny > "$tmp/junit_stdout.xml" 2> "$tmp/junit_stderr.txt"; rc=$?
check "--junit - exits 0" test "$rc" -eq 0
check "--junit - writes the XML alone to stdout" $py -c \
  'import sys, xml.etree.ElementTree as ET; c = ET.parse(sys.argv[1]).getroot().findall(".//testcase"); assert [x.get("name") for x in c] == ["fill/f32/tiny"]' \
  "$tmp/junit_stdout.xml"
check "--junit - sends the verdict lines to stderr" grep -q 'fill/f32/tiny: OK' "$tmp/junit_stderr.txt"
"$ops" --junit /dev/full --filter fill/f32/tiny > /dev/null 2> "$tmp/junit_full.txt"; rc=$?
check "--junit into a full device exits 1 (got $rc)" test "$rc" -eq 1
check "--junit into a full device says so" grep -q 'cannot write /dev/full' "$tmp/junit_full.txt"
# The JSON is written last, with the status kiln-ops exits with: an output that failed before it
# (the JUnit report, stdout) makes both 1, never a JSON saying 0 beside exit 1.
"$ops" --junit /dev/full --json "$tmp/after_junit.json" --filter fill/f32/tiny > /dev/null 2>&1; rc=$?
check "--junit failing before --json exits 1 (got $rc)" test "$rc" -eq 1
check "--junit failing: the JSON's exit_status is 1 too" $py -c \
  'import json, sys; d = json.load(open(sys.argv[1])); assert d["exit_status"] == 1 and d["status"] == "failed", d["status"]' \
  "$tmp/after_junit.json"
"$ops" --json "$tmp/after_stdout.json" --filter fill/f32/tiny > /dev/full 2> /dev/null; rc=$?
check "stdout failing before --json exits 1 (got $rc)" test "$rc" -eq 1
check "stdout failing: the JSON's exit_status is 1 too" $py -c \
  'import json, sys; d = json.load(open(sys.argv[1])); assert d["exit_status"] == 1, d["exit_status"]' \
  "$tmp/after_stdout.json"
# A usage error found after the report paths were checked leaves no report file behind.
"$ops" --json "$tmp/never.json" --junit "$tmp/never.xml" --fault nth=1 --fault-at 2 > /dev/null 2>&1; rc=$?
check "a usage error after --json/--junit exits 2 (got $rc)" test "$rc" -eq 2
check "a usage error leaves no empty report files" test ! -e "$tmp/never.json" -a ! -e "$tmp/never.xml"
check "--json into a folder that does not exist is a usage error" \
  test "$("$ops" --json "$tmp/no/such/dir/r.json" --filter fill/f32/tiny > /dev/null 2>&1; echo $?)" -eq 2
"$ops" --budget-mb 0 --filter fill/f32/tiny > /dev/null 2> "$tmp/budget0.txt"; rc=$?
check "--budget-mb 0 is a usage error (exit 2, got $rc), not a budget refusal" test "$rc" -eq 2
check "--budget-mb 0 says the range" grep -q -- '--budget-mb 0 is out of range (1 to' "$tmp/budget0.txt"

# --sweep (issue 14): one counting run, then one run per allocation request with that one
# failing; every request of the run fails once, no case FAILs, memory is back at the baseline
# after each run. The tiny f32 cases only: a sweep of the whole cpu suite is 313 runs.
tiny='/f32/tiny$'
for backend in mock cpu; do
  "$ops" --backend "$backend" --filter "$tiny" > "$tmp/plain_$backend.txt" 2>&1
  requests=$(sed -n 's/^allocations: //p' "$tmp/plain_$backend.txt")
  "$ops" --sweep --backend "$backend" --filter "$tiny" --json "$tmp/sweep_$backend.json" \
    > "$tmp/sweep_$backend.txt" 2>&1; rc=$?
  check "--sweep on $backend exits 0 (got $rc)" test "$rc" -eq 0
  check "--sweep on $backend: one run per request of a plain run ($requests)" \
    test "$(grep -c '^sweep [0-9]*/'"$requests"': request ' "$tmp/sweep_$backend.txt")" -eq "$requests"
  check "--sweep on $backend: every run refused its case with the injected DeviceOutOfMemoryError" \
    test "$(grep -c ' in [a-z_]*/f32/tiny: REFUSED DeviceOutOfMemoryError$' "$tmp/sweep_$backend.txt")" -eq "$requests"
  check "--sweep on $backend: the summary says no run broke the contract" \
    grep -q "^sweep: $requests allocation request(s) in the counting run of 10 case(s) (10 OK, 0 refused, 0 failed); $requests run(s), one per request, 0 broke the contract$" "$tmp/sweep_$backend.txt"
  check "--sweep on $backend: JSON has each request failed once, nothing left held" $py - "$tmp/sweep_$backend.json" "$requests" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); n = int(sys.argv[2]); s = d["sweep"]
assert d["status"] == "passed" and d["exit_status"] == 0 and s["error"] is None, d["status"]
assert s["allocations"] == s["runs_total"] == d["summary"]["allocations"] == n and s["broken"] == 0, s
assert [r["at"] for r in s["runs"]] == list(range(1, n + 1)), s["runs"]
for r in s["runs"]:
    assert r["ok"] and r["error"] == "DeviceOutOfMemoryError" and r["category"] and r["case"], r
    assert not any(r["leaked_bytes"].values()), r
assert d["min_budget"] is None
PY
  # --fault aimed at each category that the cases request: only those requests are failed,
  # and together they are every request of the run.
  total=0
  for category in ndarray staging; do
    "$ops" --sweep --backend "$backend" --filter "$tiny" --fault "category=$category" \
      --json "$tmp/sweep_cat.json" > "$tmp/sweep_cat.txt" 2>&1; rc=$?
    check "--sweep --fault category=$category on $backend exits 0 (got $rc)" test "$rc" -eq 0
    n=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["sweep"]["allocations"])' "$tmp/sweep_cat.json")
    total=$((total + n))
    check "--sweep --fault category=$category on $backend fails only $category requests ($n)" \
      test "$(grep -c "^sweep [0-9]*/$n: request [0-9]* ($category [0-9.]* [KMG]*i*B) in .*: REFUSED DeviceOutOfMemoryError$" "$tmp/sweep_cat.txt")" -eq "$n"
  done
  check "--sweep on $backend: the categories' requests add up to every request ($total)" test "$total" -eq "$requests"
  # The executor's own buffers come before the cases: a filter selecting only them selects
  # nothing, and a sweep with nothing to fail is SweepError (exit 3), not a pass.
  for category in argument_buffer result_buffer runtime_heap code_object; do
    "$ops" --sweep --backend "$backend" --filter "$tiny" --fault "category=$category" \
      > "$tmp/sweep_none.txt" 2>&1; rc=$?
    check "--sweep --fault category=$category on $backend selects nothing: exit 3 (got $rc)" test "$rc" -eq 3
    check "--sweep --fault category=$category on $backend says nothing was tested" \
      grep -q "SweepError: sweep: the counting run made no allocation request selected by 'category=$category'" "$tmp/sweep_none.txt"
  done
done
check "--sweep --fault category=staging sweeps the staged axpy" \
  grep -q '^sweep 1/1: request 1 (staging 28 B) in axpy_staged/f32/tiny: REFUSED DeviceOutOfMemoryError$' \
  <("$ops" --sweep --backend mock --filter "$tiny" --fault category=staging 2>&1)

# --min-budget: the smallest budget (bytes, to 4 KiB) under which the cases pass; a plain run
# under the MiB above it passes and under the MiB below it refuses a case.
"$ops" --min-budget --backend mock --heap-mb 1 --filter allocate/f32/medium --json "$tmp/mb.json" \
  > "$tmp/mb.txt" 2>&1; rc=$?
check "--min-budget exits 0 (got $rc)" test "$rc" -eq 0
check "--min-budget prints the budget in bytes and MiB" \
  grep -Eq '^min-budget: [0-9.]+ MiB \([0-9]+ bytes\) is the smallest budget under which the 1 case\(s\) pass, to 4.00 KiB' "$tmp/mb.txt"
check "--min-budget prints the peak per category at it" grep -q '^peak memory per category at it: ndarray 4.00 MiB' "$tmp/mb.txt"
check "--min-budget prints the refusal just below it" \
  grep -q '^refused just below it (budget [0-9]* bytes): BudgetExceededError: mock could not allocate 4.00 MiB for ndarray' "$tmp/mb.txt"
bytes=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["min_budget"]["budget_bytes"])' "$tmp/mb.json")
check "--min-budget's JSON has the budget it printed ($bytes)" grep -q "($bytes bytes)" "$tmp/mb.txt"
above=$(( (bytes + (1 << 20) - 1) >> 20 )); below=$(( bytes >> 20 ))
check "a plain run under ${above} MiB passes every case" \
  grep -q '^1/1 cases OK' <("$ops" --backend mock --heap-mb 1 --filter allocate/f32/medium --budget-mb "$above" 2>&1)
check "a plain run under ${below} MiB refuses the case" \
  grep -q 'REFUSED BudgetExceededError' <("$ops" --backend mock --heap-mb 1 --filter allocate/f32/medium --budget-mb "$below" 2>&1)

# The named errors: status 3, said on stderr.
"$ops" --min-budget --backend mock --filter allocate/f32/medium --budget-mb 17 > /dev/null 2> "$tmp/mb_err.txt"; rc=$?
check "--min-budget of cases refused under the largest budget exits 3 (got $rc)" test "$rc" -eq 3
check "... and says MinBudgetError" grep -q '^kiln-ops: MinBudgetError: min_budget: the workload fails even under the largest budget, 17825792 bytes: BudgetExceededError' "$tmp/mb_err.txt"
"$ops" --min-budget --backend mock --filter allocate/f32/medium --budget-mb 1 > /dev/null 2> "$tmp/mb_setup.txt"; rc=$?
check "--min-budget under a budget the executor itself does not fit exits 1, as a plain run (got $rc)" test "$rc" -eq 1
check "... and names the set-up, the budget's figure and kiln-ops' own knob" \
  grep -q '^kiln-ops: could not set up the mock backend: BudgetExceededError: .*budget 1.00 MiB.*(--budget-mb or KILN_POOL_LIMIT_MB)' "$tmp/mb_setup.txt"
"$ops" --sweep --backend mock --filter allocate/f32/medium --budget-mb 17 > /dev/null 2> "$tmp/sw_err.txt"; rc=$?
check "--sweep of cases refused without a fault exits 3 (got $rc)" test "$rc" -eq 3
check "... and says SweepError" grep -q '^kiln-ops: SweepError: sweep: the workload fails without any fault: BudgetExceededError' "$tmp/sw_err.txt"
"$ops" --sweep --backend mock --filter allocate/f32/medium --budget-mb 17 --junit "$tmp/sw_err.xml" > /dev/null 2>&1
check "--sweep with no answer is an <error> in the JUnit report, not all skipped" \
  bash -c "grep -A1 'name=\"sweep\"' '$tmp/sw_err.xml' | grep -q '<error type=\"SweepError\"' && grep -q 'errors=\"1\"' '$tmp/sw_err.xml'"
"$ops" --min-budget --backend mock --filter allocate/f32/medium --budget-mb 17 --junit "$tmp/mb_err.xml" > /dev/null 2>&1
check "--min-budget with no answer is an <error> in the JUnit report" \
  bash -c "grep -A1 'name=\"min-budget\"' '$tmp/mb_err.xml' | grep -q '<error type=\"MinBudgetError\"'"

# Exclusive options: usage errors naming the conflict, nothing run.
while IFS='|' read -r args words; do
  # shellcheck disable=SC2086
  "$ops" $args --filter "$tiny" > "$tmp/excl.txt" 2>&1; rc=$?
  check "'$args' exits 2 (got $rc)" test "$rc" -eq 2
  check "'$args' says: $words" grep -qF -- "$words" "$tmp/excl.txt"
  check "'$args' runs nothing" bash -c "! grep -q '^sweep \|^min-budget' '$tmp/excl.txt'"
done <<'ARGS'
--sweep --min-budget|--sweep and --min-budget cannot both be given
--sweep --repeat 2|--sweep and --repeat 2 cannot both be given
--min-budget --repeat 3|--min-budget and --repeat 3 cannot both be given
--sweep --fault-at 3|--sweep and --fault-at cannot both be given
--min-budget --fault-at 3|--min-budget and --fault-at cannot both be given
--min-budget --fault category=staging|--min-budget and --fault cannot both be given
--sweep --fault nth=2,category=staging|--sweep takes --fault with category=, min_bytes= and kernel= terms only
--sweep --fault p=0.5,seed=1|--sweep takes --fault with category=, min_bytes= and kernel= terms only
--sweep --fault kind=lost,category=ndarray|--sweep takes --fault of kind=oom only
--sweep --fault kind=launch,kernel=axpy|--sweep takes --fault of kind=oom only
ARGS
# KILN_FAULT's kernel= is checked as --fault's is: a usage error, not a set-up failure.
KILN_FAULT=kernel=axpyy "$ops" --filter fill/f32/tiny > /dev/null 2> "$tmp/envkernel.txt"; rc=$?
check "KILN_FAULT=kernel=axpyy exits 2 (got $rc)" test "$rc" -eq 2
check "KILN_FAULT=kernel=axpyy names the variable and the ops" \
  grep -q 'KILN_FAULT: .*kernel=axpyy names no kernel; the ops are' "$tmp/envkernel.txt"
"$ops" --help > "$tmp/help.txt" 2>&1
for word in '--sweep' '--min-budget' '^  3 '; do
  check "--help documents '$word'" grep -q -- "$word" "$tmp/help.txt"
done

if [ "$failures" -ne 0 ]; then echo "kiln_ops_cli: $failures check(s) failed"; exit 1; fi
echo "kiln_ops_cli: all checks passed"
