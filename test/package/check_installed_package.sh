#!/usr/bin/env bash
# Installs the kiln build in $1 into a scratch prefix, then configures, builds and runs the
# consumer project (test/package/consumer) against it with find_package(kiln 0.2). ctest
# "package_consumer" runs it after the build.
set -euo pipefail
build=$(cd "$1" && pwd)
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch="$build/package-test"
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" > "$scratch.install.log"
test -f "$scratch/prefix/lib/cmake/kiln/kilnConfig.cmake"
test -f "$scratch/prefix/include/kiln/executor/executor.h"
test -x "$scratch/prefix/bin/kiln-ops"
cmake -S "$source_dir/consumer" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$scratch/consumer" -j 2
"$scratch/consumer/kiln_consumer"
echo "installed package: ok"
