; A user kernel (kiln's user-kernel ABI, kiln/runtime/kernel_abi.h) for the C++ and Python tests:
; each element allocates `bytes` from the device heap and writes through it; a null result returns
; (the launch then fails with the heap's figures).
declare ptr @kiln_heap_allocate(ptr, i64, i64)
define void @heap_user(ptr %ctx, ptr %out, i64 %bytes) {
  %block = call ptr @kiln_heap_allocate(ptr %ctx, i64 %bytes, i64 8)
  %null = icmp eq ptr %block, null
  br i1 %null, label %done, label %use
use:
  store i64 7, ptr %block
  ret void
done:
  ret void
}
