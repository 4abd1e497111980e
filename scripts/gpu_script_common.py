"""What the GPU machine's Python checks (gpu_interop.py, gpu_timing.py) share: the result lines
they print and append to the results file named by argv[1], optional imports of CuPy and PyTorch
(absent or broken: skipped with the reason), and the kiln CUDA executor they start from. Plain
Python, no third-party imports at module level; run on the GPU machine by scripts/gpu-check.sh."""

import sys

out_path = sys.argv[1] if len(sys.argv) > 1 else None
failed = False  # a FAIL line was reported


def report(verdict, name, detail=""):
    """Prints "<verdict> <name>[: detail]" and appends it to the results file, if any."""
    global failed
    failed = failed or verdict == "FAIL"
    line = f"{verdict} {name}" + (f": {detail}" if detail else "")
    print(line, flush=True)
    if out_path:
        with open(out_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def optional_import(name):
    """(module, None), or (None, why) when it does not import."""
    try:
        return __import__(name), None
    except Exception as e:  # noqa: BLE001 - absent or broken: skipped with the reason
        return None, f"{name} not importable ({type(e).__name__}: {e})"


def kiln_on_cuda(section):
    """The kiln module with its executor on cuda, or None after a SKIP line naming `section`
    (kiln not importable with this Python, or no CUDA executor)."""
    try:
        import kiln
    except Exception as e:  # noqa: BLE001
        report("SKIP", section, f"kiln not importable with {sys.executable} "
               f"{sys.version.split()[0]} ({type(e).__name__}: {e}); set PYTHONPATH to the kiln "
               "package built for this Python")
        return None
    try:
        kiln.init(arch="cuda")
    except kiln.Error as e:
        report("SKIP", section, f"no CUDA executor: {type(e).__name__}: {e}")
        return None
    return kiln


def gpu_libraries():
    """(cupy, why_missing, torch, why_missing): torch counts as missing without a CUDA device."""
    cupy, cupy_missing = optional_import("cupy")
    torch, torch_missing = optional_import("torch")
    if torch is not None and not torch.cuda.is_available():
        torch, torch_missing = None, "torch has no CUDA device here"
    return cupy, cupy_missing, torch, torch_missing
