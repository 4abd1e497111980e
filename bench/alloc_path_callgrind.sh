#!/usr/bin/env bash
# Instructions per call of DeviceMemory's pool hits and budget refusal (callgrind): each case runs
# at two call counts and the difference is divided by the extra calls, so start-up cancels out.
# Usage: bench/alloc_path_callgrind.sh [BUILD_DIR]   (needs valgrind)
set -euo pipefail
build=${1:-build}
binary="$build/bin/kiln-alloc-path-instructions"
count() {  # CASE N -> instructions collected
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$binary" "$1" "$2" 2>&1 |
    sed -n 's/.*Collected : *\([0-9]*\).*/\1/p'
}
for case in pool_hit_locked pool_hit_fast refusal; do
  low=$(count "$case" 1000)
  high=$(count "$case" 3000)
  unit="allocate + free"
  [ "$case" = refusal ] && unit="refused allocate"
  echo "$case: $(( (high - low) / 2000 )) instructions per $unit"
done
