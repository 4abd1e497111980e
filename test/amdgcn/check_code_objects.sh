#!/usr/bin/env bash
# Checks every HSACO kiln built with LLVM's own reader: an ELF shared object for EM_AMDGPU, HSA
# OS/ABI, code object metadata naming amdgcn-amd-amdhsa--<gfx>, and 24 kernels (one kernel
# descriptor "<name>.kd" per kiln_<op>_<dtype>_gpu, which only the amdgpu_kernel calling
# convention produces), and EF_AMDGPU_MACH in the ELF flags read as a raw value (llvm-readobj-14
# has no name for gfx1100's 0x041, which LLVM 14 only reserves).
# usage: check_code_objects.sh <llvm-readobj> <dir with kiln_<gfx>.hsaco> <gfx>...
set -u
readobj="$1"; dir="$2"; shift 2
failures=0
mach_of() {  # EF_AMDGPU_MACH values from LLVM's BinaryFormat/ELF.h
  case "$1" in
    gfx908) echo $((0x030)) ;; gfx1030) echo $((0x036)) ;; gfx90a) echo $((0x03f)) ;;
    gfx1100) echo $((0x041)) ;; *) echo unknown ;;
  esac
}
check() {
  local what="$1"; shift
  if "$@"; then echo "ok - $what"; else echo "not ok - $what"; failures=$((failures + 1)); fi
}
[ "$#" -gt 0 ] || { echo "not ok - no code objects were built"; exit 1; }
for gfx in "$@"; do
  hsaco="$dir/kiln_$gfx.hsaco"
  "$readobj" --file-headers --notes "$hsaco" > "$dir/kiln_$gfx.readobj.txt" 2>&1
  out="$dir/kiln_$gfx.readobj.txt"
  check "$gfx: readobj reads it" test -s "$out"
  check "$gfx: Machine EM_AMDGPU (224)" grep -Eq 'Machine: EM_AMDGPU \(0xE0\)' "$out"
  check "$gfx: OS/ABI AMDGPU_HSA" grep -Eq 'OS/ABI: AMDGPU_HSA' "$out"
  check "$gfx: a shared object" grep -Eq 'Type: SharedObject' "$out"
  flags="$(sed -nE 's/^ *Flags \[ \((0x[0-9A-Fa-f]+)\)$/\1/p' "$out" | head -n 1)"
  check "$gfx: EF_AMDGPU_MACH $(mach_of "$gfx") in the flags ($flags)" \
    test "$(( ${flags:-0} & 0xff ))" = "$(mach_of "$gfx")"
  check "$gfx: metadata target amdgcn-amd-amdhsa--$gfx" grep -Eq "amdhsa.target: +amdgcn-amd-amdhsa--$gfx\$" "$out"
  check "$gfx: 24 kernel descriptors" test "$(grep -Ec '\.symbol: +kiln_[a-z_]+_(f32|f64|i32|i64)_gpu\.kd$' "$out")" -eq 24
done
if [ "$failures" -ne 0 ]; then echo "check_code_objects: $failures check(s) failed"; exit 1; fi
echo "check_code_objects: all checks passed"
