#!/usr/bin/env bash
# Installs the kiln build in $1 into a scratch prefix, checks that the installed headers are
# exactly the public ones (<layer>/include/; none of <layer>/internal/) and that each compiles on
# its own against the prefix (test/package/header_check), then configures, builds and runs the
# consumer project (test/package/consumer) against it with find_package(kiln 0.2). ctest
# "package_consumer" runs it after the build.
set -euo pipefail
build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$source_dir/../.." && pwd)
scratch="$build/package-test"
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" > "$scratch.install.log"
test -f "$scratch/prefix/lib/cmake/kiln/kilnConfig.cmake"
test -f "$scratch/prefix/include/kiln/executor/executor.h"
test -x "$scratch/prefix/bin/kiln-ops"

# No internal header is installed, and the installed headers are exactly the public ones.
internal=0
for layer in rhi runtime executor; do
  [ -d "$root/$layer/internal" ] || continue
  while IFS= read -r header; do
    internal=$((internal + 1))
    if [ -e "$scratch/prefix/include/$header" ]; then
      echo "internal header installed: include/$header (from $layer/internal/)" >&2
      exit 1
    fi
  done < <(cd "$root/$layer/internal" && find . -type f | sed 's|^\./||')
done
if [ "$internal" -eq 0 ]; then
  echo "no internal headers found under $root/*/internal: is this kiln's source tree?" >&2
  exit 1
fi
public=$(for layer in rhi runtime executor; do
           (cd "$root/$layer/include" && find . -type f | sed 's|^\./||')
         done | sort)
installed=$(cd "$scratch/prefix/include" && find . -type f | sed 's|^\./||' | sort)
if [ "$public" != "$installed" ]; then
  echo "installed headers differ from the public ones (<: public only, >: installed only):" >&2
  diff <(echo "$public") <(echo "$installed") >&2 || true
  exit 1
fi
echo "installed headers: $(echo "$installed" | wc -l) public, none of $internal internal"

# Each installed header compiles alone against the prefix.
cmake -S "$source_dir/header_check" -B "$scratch/header_check" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$scratch/header_check" -j 2

cmake -S "$source_dir/consumer" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$scratch/consumer" -j 2
"$scratch/consumer/kiln_consumer"
echo "installed package: ok"
