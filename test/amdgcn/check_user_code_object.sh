#!/usr/bin/env bash
# Checks the HSACO code object kiln makes at run time for a user kernel (kiln-ptx gfx<id> --user,
# the same generate_user_hsaco UserKernel::create calls), with LLVM 19's own reader: for each
# processor given, an ELF shared object for EM_AMDGPU, HSA OS/ABI, ABI version 3 (code object
# v5), metadata naming amdgcn-amd-amdhsa--<gfx>, one kernel descriptor kiln_user_entry_gpu.kd,
# and the user's IR in the section .kiln.user_module, which no segment loads.
# usage: check_user_code_object.sh <kiln-ptx> <llvm-readobj> <user .ll> <work dir> <gfx>...
set -u
kiln_ptx="$1"; readobj="$2"; ir="$3"; dir="$4"; shift 4
mkdir -p "$dir"
failures=0
check() {
  local what="$1"; shift
  if "$@"; then echo "ok - $what"; else echo "not ok - $what"; failures=$((failures + 1)); fi
}
for gfx in "$@"; do
  hsaco="$dir/user_$gfx.hsaco"
  out="$dir/user_$gfx.readobj.txt"
  check "$gfx: kiln-ptx makes the user HSACO" "$kiln_ptx" "$gfx" --user "$ir" squared_diff ptr,ptr,ptr,float \
    > "$hsaco" || continue
  "$readobj" --file-headers --notes --sections --program-headers "$hsaco" > "$out" 2>&1
  check "$gfx: Machine EM_AMDGPU (224)" grep -Eq 'Machine: EM_AMDGPU \(0xE0\)' "$out"
  check "$gfx: OS/ABI AMDGPU_HSA" grep -Eq 'OS/ABI: AMDGPU_HSA' "$out"
  check "$gfx: ABI version 3 (code object v5)" grep -Eq 'ABIVersion: 3$' "$out"
  check "$gfx: a shared object" grep -Eq 'Type: SharedObject' "$out"
  check "$gfx: metadata target amdgcn-amd-amdhsa--$gfx" grep -Eq "amdhsa.target: +amdgcn-amd-amdhsa--$gfx\$" "$out"
  check "$gfx: one kernel descriptor, kiln_user_entry_gpu.kd" \
    test "$(grep -Ec '\.symbol: +[A-Za-z_.]+\.kd$' "$out")" -eq 1 -a "$(grep -Ec '\.symbol: +kiln_user_entry_gpu\.kd$' "$out")" -eq 1
  check "$gfx: the user's IR in .kiln.user_module" grep -Eq 'Name: \.kiln\.user_module' "$out"
  # SHF_ALLOC unset: the section's Flags list is empty, so no PT_LOAD segment copies it.
  check "$gfx: .kiln.user_module is not allocated" \
    bash -c "grep -A4 'Name: .kiln.user_module' '$out' | grep -Eq 'Flags \[ \(0x0\)'"
done
if [ "$failures" -ne 0 ]; then echo "check_user_code_object: $failures check(s) failed"; exit 1; fi
echo "check_user_code_object: all checks passed"
