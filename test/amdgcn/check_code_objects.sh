#!/usr/bin/env bash
# Checks the HSACO code objects kiln built, with LLVM 19's own reader (llvm-readobj-19): every
# processor the issue asks for must have one (a processor missing from KILN_AMDGPU_TARGETS, or
# one LLVM could not build, fails here), and each is an ELF shared object for EM_AMDGPU, HSA
# OS/ABI, ABI version 3 (code object v5), EF_AMDGPU_MACH naming its processor (read as a raw
# value), code object metadata naming amdgcn-amd-amdhsa--<gfx>, and 24 kernels (one kernel
# descriptor "<name>.kd" per kiln_<op>_<dtype>_gpu, which only the amdgpu_kernel calling
# convention produces). A processor built beyond the required ones is checked the same way.
# usage: check_code_objects.sh <llvm-readobj> <dir with kiln_<gfx>.hsaco> <gfx built>...
set -u
readobj="$1"; dir="$2"; shift 2
required=(gfx90a gfx942 gfx1100 gfx908 gfx1030 gfx1101 gfx1102 gfx1200 gfx1201)
failures=0
mach_of() {  # EF_AMDGPU_MACH values from LLVM 19's BinaryFormat/ELF.h
  case "$1" in
    gfx908) echo $((0x030)) ;; gfx1030) echo $((0x036)) ;; gfx90a) echo $((0x03f)) ;;
    gfx1100) echo $((0x041)) ;; gfx1101) echo $((0x046)) ;; gfx1102) echo $((0x047)) ;;
    gfx1200) echo $((0x048)) ;; gfx942) echo $((0x04c)) ;; gfx1201) echo $((0x04e)) ;;
    *) echo unknown ;;
  esac
}
check() {
  local what="$1"; shift
  if "$@"; then echo "ok - $what"; else echo "not ok - $what"; failures=$((failures + 1)); fi
}
built=" $* "
for gfx in "${required[@]}"; do
  check "$gfx: built (in KILN_AMDGPU_BUILT_TARGETS)" test "${built/ $gfx /}" != "$built"
done
all=("${required[@]}")
for gfx in "$@"; do [[ " ${required[*]} " == *" $gfx "* ]] || all+=("$gfx"); done
for gfx in "${all[@]}"; do
  hsaco="$dir/kiln_$gfx.hsaco"
  out="$dir/kiln_$gfx.readobj.txt"
  check "$gfx: $hsaco exists" test -s "$hsaco" || continue
  "$readobj" --file-headers --notes "$hsaco" > "$out" 2>&1
  check "$gfx: readobj reads it" test -s "$out"
  check "$gfx: Machine EM_AMDGPU (224)" grep -Eq 'Machine: EM_AMDGPU \(0xE0\)' "$out"
  check "$gfx: OS/ABI AMDGPU_HSA" grep -Eq 'OS/ABI: AMDGPU_HSA' "$out"
  check "$gfx: ABI version 3 (code object v5)" grep -Eq 'ABIVersion: 3$' "$out"
  check "$gfx: a shared object" grep -Eq 'Type: SharedObject' "$out"
  flags="$(sed -nE 's/^ *Flags \[ \((0x[0-9A-Fa-f]+)\)$/\1/p' "$out" | head -n 1)"
  check "$gfx: EF_AMDGPU_MACH $(mach_of "$gfx") in the flags ($flags)" \
    test "$(( ${flags:-0} & 0xff ))" = "$(mach_of "$gfx")"
  check "$gfx: metadata target amdgcn-amd-amdhsa--$gfx" grep -Eq "amdhsa.target: +amdgcn-amd-amdhsa--$gfx\$" "$out"
  check "$gfx: 24 kernel descriptors" test "$(grep -Ec '\.symbol: +kiln_[a-z_]+_(f32|f64|i32|i64)_gpu\.kd$' "$out")" -eq 24
done
if [ "$failures" -ne 0 ]; then echo "check_code_objects: $failures check(s) failed"; exit 1; fi
echo "check_code_objects: all checks passed"
