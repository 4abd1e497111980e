"""Your own kernels with kiln: CuPy's squared difference and L2 norm, a kernel from LLVM IR, and
what a mistake looks like. Checks every result against numpy; prints OK.

    PYTHONPATH=build/python /usr/bin/python3 examples/user_kernels.py
"""

import numpy as np

import kiln

squared_diff = kiln.ElementwiseKernel(
    "float32 x, float32 y", "float32 z", "z = (x - y) * (x - y)", "squared_diff")
l2norm = kiln.ReductionKernel(
    "T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")

# z[i] = x[i] * alpha: an element function in kiln's user-kernel ABI (kiln/runtime/kernel_abi.h).
SCALE_IR = """
declare i64 @kiln_index(ptr)
define void @scale(ptr %ctx, ptr %x, ptr %z, float %alpha) {
  %i = call i64 @kiln_index(ptr %ctx)
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  %r = fmul float %v, %alpha
  %pz = getelementptr float, ptr %z, i64 %i
  store float %r, ptr %pz
  ret void
}
"""
scale = kiln.Kernel(SCALE_IR, "scale", "in float32 x, out float32 z, float32 alpha")


def main() -> None:
    host_x = np.linspace(-1.0, 1.0, 1000, dtype=np.float32)
    host_y = np.cos(host_x)
    x, y = kiln.from_numpy(host_x), kiln.from_numpy(host_y)

    z = squared_diff(x, y)                       # the output is allocated: f32[1000]
    np.testing.assert_array_equal(np.asarray(z), (host_x - host_y) ** 2)
    squared_diff(x, 0.5, z)                      # a scalar input, the output written in place
    np.testing.assert_array_equal(np.asarray(z), (host_x - np.float32(0.5)) ** 2)

    m = kiln.from_numpy(host_x.reshape(10, 100))
    np.testing.assert_allclose(np.asarray(l2norm(x)), np.linalg.norm(host_x), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(l2norm(m, axis=1)), np.linalg.norm(host_x.reshape(10, 100), axis=1),
                               rtol=1e-5)

    scale(x, z, 3.0)
    np.testing.assert_array_equal(np.asarray(z), host_x * np.float32(3.0))

    try:
        kiln.ElementwiseKernel("float32 x", "float32 z", "z = x * (x + 1", "broken")
    except kiln.KernelCompileError as e:         # an InvalidUsageError, so also a ValueError
        assert (e.line, e.column) == (1, 15)
        print(e)
    try:
        squared_diff(x, kiln.from_numpy(np.ones(3, dtype=np.float32)))
    except kiln.InvalidUsageError as e:          # checked before anything is allocated
        print(e)
    print("OK")


if __name__ == "__main__":
    main()
