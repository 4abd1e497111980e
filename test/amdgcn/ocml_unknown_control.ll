; A stand-in for ROCm's ocml.bc (test_device_math.cpp) whose tanh reads an oclc control kiln does
; not know: a future ocml. kiln must refuse it by name rather than give the control a guess.
target triple = "amdgcn-amd-amdhsa"

@__oclc_future_knob = external addrspace(4) constant i32

define double @__ocml_tanh_f64(double %x) {
  %k = load i32, ptr addrspace(4) @__oclc_future_knob
  %d = sitofp i32 %k to double
  %r = fadd double %x, %d
  ret double %r
}
