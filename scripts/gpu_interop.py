#!/usr/bin/env python3
"""The interop section of the GPU check, for a real NVIDIA machine with CuPy and/or PyTorch.

    PYTHONPATH=<dir holding the kiln package> python3 scripts/gpu_interop.py [RESULTS_FILE]
    scripts/gpu-check.sh interop [OUT_DIR]     # the same, writing OUT_DIR/gpu-interop.txt

Each check prints one line, PASS, FAIL or SKIP with its reason, to stdout and RESULTS_FILE:

- cupy.asarray(a) (the CUDA Array Interface) and cupy.from_dlpack(a): the same device pointer as
  kiln's array, values checked, a write on CuPy's side seen by kiln.
- torch.from_dlpack(a): the same pointer, values checked, a write on torch's side seen by kiln.
- kiln.from_dlpack(torch_tensor) and kiln.from_dlpack(cupy_array): the same pointer, kiln's
  fill and axpy seen by torch/CuPy, the tensor still valid after the kiln array is gone.
- A kiln out-of-memory error raised while CuPy and PyTorch hold device memory: a MemoryError
  whose free_bytes is the free memory CuPy/PyTorch report at that moment (within 64 MiB: kiln's
  own growth in between) and whose total_bytes is the device's total.

Skips cleanly, saying why, where kiln does not import (a Python other than the one kiln was
built for), where kiln has no CUDA executor (no driver, no GPU) and where CuPy or PyTorch are
absent. Exit status: 0 when nothing failed (skips included), 1 when a check failed.
Written without a GPU at hand: it has not run on a real GPU yet.
"""
import contextlib
import sys
import traceback

import gpu_script_common as common
from gpu_script_common import report

MiB = 1 << 20
GiB = 1 << 30
N = 1 << 20  # elements of the arrays exchanged (4 MiB of float32)

def check(name, fn):
    """Runs one check; an AssertionError or any exception is a FAIL with its reason."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
        report("FAIL", name, f"{type(e).__name__}: {e}\n" + traceback.format_exc(limit=3))
        return
    report("PASS", name)


def main():
    import numpy as np

    kiln = common.kiln_on_cuda("interop")
    if kiln is None:
        return 0
    cupy, cupy_missing, torch, torch_missing = common.gpu_libraries()
    expected = np.arange(N, dtype=np.float32)

    def kiln_array():
        return kiln.from_numpy(expected)

    def kiln_pointer(a):
        return a.__cuda_array_interface__["data"][0]

    # --- kiln -> CuPy / PyTorch ----------------------------------------------------------------
    if cupy is None:
        report("SKIP", "cupy", cupy_missing)
    else:
        def cupy_asarray():
            a = kiln_array()
            c = cupy.asarray(a)  # __cuda_array_interface__
            assert c.data.ptr == kiln_pointer(a), (c.data.ptr, kiln_pointer(a))
            assert (cupy.asnumpy(c) == expected).all()
            c *= 2
            cupy.cuda.Device().synchronize()
            assert (a.to_numpy() == 2 * expected).all()

        def cupy_from_dlpack():
            a = kiln_array()
            c = cupy.from_dlpack(a)
            assert c.data.ptr == kiln_pointer(a)
            assert (cupy.asnumpy(c) == expected).all()
            del c
            with contextlib.suppress(kiln.InvalidUsageError):
                a.free()  # refused for good: kiln_pointer read its __cuda_array_interface__
            del a  # garbage collection frees it

        def kiln_from_cupy():
            c = cupy.arange(N, dtype=cupy.float32)
            k = kiln.from_dlpack(c)
            assert kiln_pointer(k) == c.data.ptr
            kiln.fill(k, 3)
            assert (cupy.asnumpy(c) == 3).all()
            del k
            assert float(c.sum()) == 3 * N  # CuPy's memory still valid after kiln let go

        check("cupy.asarray(kiln array) zero-copy", cupy_asarray)
        check("cupy.from_dlpack(kiln array) zero-copy", cupy_from_dlpack)
        check("kiln.from_dlpack(cupy array) zero-copy", kiln_from_cupy)

    if torch is None:
        report("SKIP", "torch", torch_missing)
    else:
        def torch_from_dlpack():
            a = kiln_array()
            t = torch.from_dlpack(a)
            assert t.is_cuda and t.data_ptr() == kiln_pointer(a), (t.data_ptr(), kiln_pointer(a))
            assert (t.cpu().numpy() == expected).all()
            t.add_(1)
            torch.cuda.synchronize()
            assert (a.to_numpy() == expected + 1).all()

        def kiln_from_torch():
            t = torch.arange(N, dtype=torch.float32, device="cuda")
            k = kiln.from_dlpack(t)
            assert kiln_pointer(k) == t.data_ptr()
            ones = kiln.from_numpy(np.ones(N, dtype=np.float32))
            kiln.axpy(2.0, ones, k)  # t = 2 + t
            assert (t.cpu().numpy() == expected + 2).all()
            del k
            assert float(t.sum()) == float((expected + 2).sum())

        check("torch.from_dlpack(kiln array) zero-copy", torch_from_dlpack)
        check("kiln.from_dlpack(torch tensor) zero-copy", kiln_from_torch)

    # --- a kiln OOM while CuPy / PyTorch hold memory -------------------------------------------
    if cupy is None and torch is None:
        report("SKIP", "oom beside cupy/torch", "neither CuPy nor PyTorch is here")
        return 1 if common.failed else 0

    def mem_info():
        if cupy is not None:
            return cupy.cuda.runtime.memGetInfo()
        return torch.cuda.mem_get_info()

    def oom_beside_others():
        kiln.init(arch="cuda")
        free, total = mem_info()
        held = []
        if torch is not None:
            held.append(torch.empty(int(free * 0.3) // 4, dtype=torch.float32, device="cuda"))
        if cupy is not None:
            held.append(cupy.empty(int(free * 0.3) // 4, dtype=cupy.float32))
        if torch is not None:
            torch.cuda.synchronize()
        free_now, total_now = mem_info()
        assert total_now == total
        try:
            kiln.ndarray(kiln.f32, (free_now + GiB) // 4)
        except MemoryError as e:
            assert isinstance(e, kiln.OutOfMemoryError), type(e)
            assert e.total_bytes == total, (e.total_bytes, total)
            assert e.free_bytes is not None and abs(e.free_bytes - free_now) <= 64 * MiB, \
                (e.free_bytes, free_now)
            report("PASS", "oom figures", f"{type(e).__name__}: free {e.free_bytes} (others "
                   f"say {free_now}), total {e.total_bytes}; {e}")
        else:
            raise AssertionError(f"{free_now + GiB} bytes beyond the {free_now} free were allocated")
        del held
        small = kiln.ndarray(kiln.f32, 1024)  # and the next small one works
        small.free()

    check("kiln OOM beside CuPy/PyTorch names the right free/total", oom_beside_others)
    return 1 if common.failed else 0


if __name__ == "__main__":
    sys.exit(main())
