; A user kernel calling library math that LLVM's NVPTX back end cannot lower by itself, for the
; ptxas test with the CUDA toolkit's libdevice: y[i] = tanh(pow(exp(x[i]), x[i])) in float32 and
; float64 (exp and pow float32, tanh float64).
declare i64 @kiln_index(ptr)
declare float @llvm.exp.f32(float)
declare float @llvm.pow.f32(float, float)
declare double @llvm.tanh.f64(double)
define void @library_math(ptr %ctx, ptr %x, ptr %y) {
  %i = call i64 @kiln_index(ptr %ctx)
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  %e = call float @llvm.exp.f32(float %v)
  %p = call float @llvm.pow.f32(float %e, float %v)
  %d = fpext float %p to double
  %t = call double @llvm.tanh.f64(double %d)
  %r = fptrunc double %t to float
  %py = getelementptr float, ptr %y, i64 %i
  store float %r, ptr %py
  ret void
}
