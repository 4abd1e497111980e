; A user kernel (kernel_abi.h's user-kernel ABI) for the ptxas test: z[i] = (x[i] - y[i])^2 * scale,
; and an element that allocates from the device heap and asserts.
@msg = private constant [17 x i8] c"no heap for z[i]\00"
declare i64 @kiln_index(ptr)
declare ptr @kiln_heap_allocate(ptr, i64, i64)
declare void @kiln_assert(ptr, i32, ptr)
define void @squared_diff(ptr %ctx, ptr %x, ptr %y, ptr %z, float %scale) {
  %i = call i64 @kiln_index(ptr %ctx)
  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %pz = getelementptr float, ptr %z, i64 %i
  %a = load float, ptr %px
  %b = load float, ptr %py
  %d = fsub float %a, %b
  %s = fmul float %d, %d
  %r = fmul float %s, %scale
  %block = call ptr @kiln_heap_allocate(ptr %ctx, i64 4, i64 4)
  %ok = icmp ne ptr %block, null
  %c = zext i1 %ok to i32
  call void @kiln_assert(ptr %ctx, i32 %c, ptr @msg)
  store float %r, ptr %pz
  ret void
}
