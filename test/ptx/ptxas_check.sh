#!/bin/sh
# Assembles kiln's PTX with the CUDA toolkit's ptxas, once per SM version: the device runtime's
# and a user kernel's (squared_diff.ll beside this script, through kiln-ptx --user); where the
# toolkit's libdevice is beside ptxas (../nvvm/libdevice), a user kernel calling exp, pow and tanh
# (library_math.ll) linked with it.
#   ptxas_check.sh <kiln-ptx> <ptxas> <work dir> <sm_arch>...
# For each arch: kiln-ptx <arch> > <work dir>/kiln_<arch>.ptx, then
# ptxas -arch=<arch> on it. Exit status 0 only if every arch assembles.
set -eu
kiln_ptx=$1
ptxas=$2
work_dir=$3
shift 3
mkdir -p "$work_dir"
for arch in "$@"; do
  ptx="$work_dir/kiln_$arch.ptx"
  "$kiln_ptx" "$arch" > "$ptx"
  grep -q '^\.visible \.entry kiln_axpy_f32_gpu(' "$ptx"
  grep -qx "\.target $arch" "$ptx"  # native: never an older SM version the driver forwards
  "$ptxas" -arch="$arch" "$ptx" -o "$work_dir/kiln_$arch.cubin"
  echo "ptxas -arch=$arch: OK ($(grep -c '\.entry' "$ptx") entries, $(grep '^\.target' "$ptx"), $(grep '^\.version' "$ptx"))"
  user="$work_dir/user_$arch.ptx"
  "$kiln_ptx" "$arch" --user "$(dirname "$0")/squared_diff.ll" squared_diff ptr,ptr,ptr,float > "$user"
  grep -q '^\.visible \.entry kiln_user_entry_gpu(' "$user"
  grep -q '^// kiln-user-module squared_diff pppf ' "$user"
  "$ptxas" -arch="$arch" "$user" -o "$work_dir/user_$arch.cubin"
  echo "ptxas -arch=$arch: user kernel OK"
  libdevice="$(dirname "$ptxas")/../nvvm/libdevice/libdevice.10.bc"
  if [ -f "$libdevice" ]; then
    math="$work_dir/library_math_$arch.ptx"
    KILN_LIBDEVICE="$libdevice" "$kiln_ptx" "$arch" --user "$(dirname "$0")/library_math.ll" library_math ptr,ptr > "$math"
    ! grep -q '\.extern' "$math"  # nothing left for the driver to find
    "$ptxas" -arch="$arch" "$math" -o "$work_dir/library_math_$arch.cubin"
    echo "ptxas -arch=$arch: user kernel with libdevice's exp, pow, tanh OK"
  fi
done
