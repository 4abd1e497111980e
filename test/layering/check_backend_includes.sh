#!/usr/bin/env bash
# The layers above rhi/ include no backend header: rhi's backend registry
# (kiln/rhi/backend_registry.h) makes every device, so a new backend touches rhi/ only.
# usage: check_backend_includes.sh <source root>
set -u
root=${1:?usage: check_backend_includes.sh <source root>}
pattern='#include "kiln/rhi/(cpu|mock|cuda|amdgpu)[a-z_]*\.h"'
hits=$(grep -rnE "$pattern" "$root/executor" "$root/bindings" "$root/tools" "$root/runtime")
if [ -n "$hits" ]; then
  echo "backend headers included above rhi/ (use kiln/rhi/backend_registry.h):"
  echo "$hits"
  exit 1
fi
echo "check_backend_includes: no backend header above rhi/"
