; A stand-in for CUDA's libdevice (libdevice.10.bc), for the tests of link_libdevice on machines
; without the CUDA toolkit: two of its functions, with bodies no real math library has (x * 3,
; x * 5), so a test sees which code was linked; everything else is missing on purpose.
define float @__nv_expf(float %x) {
  %r = fmul float %x, 3.0
  ret float %r
}

define double @__nv_tanh(double %x) {
  %r = fmul double %x, 5.0
  ret double %r
}
