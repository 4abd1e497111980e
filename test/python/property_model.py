"""The model and configuration of the property test (test_property.py): what one live array is
(its numpy model and the bytes it was charged), the backends to run, the random shapes and faults
the rules draw, and the count of kiln calls. Imported by the test only after Hypothesis is known to
be installed."""
import os

import numpy as np
from hypothesis import strategies as st

import kiln

MiB = 1 << 20
EXAMPLES = int(os.environ.get("KILN_PROPERTY_EXAMPLES", "40"))
STEPS = int(os.environ.get("KILN_PROPERTY_STEPS", "40"))
SEED = os.environ.get("KILN_PROPERTY_SEED")
REPORT = os.environ.get("KILN_PROPERTY_REPORT")
BURST = int(os.environ.get("KILN_PROPERTY_BURST", "4"))

DTYPES = {kiln.f32: np.float32, kiln.f64: np.float64, kiln.i32: np.int32, kiln.i64: np.int64}
KILN_DTYPES = list(DTYPES)
# Values stay small so that every result is exact in every dtype (|value| <= LIMIT, sums of at
# most a few thousand of them fit the 24-bit mantissa of f32 only when small: see exact_sum).
LIMIT = 1 << 12

OPERATIONS = {"count": 0}


def count():
    """Counts one kiln call; every 10,000 a progress line goes to KILN_PROPERTY_REPORT."""
    OPERATIONS["count"] += 1
    if REPORT and OPERATIONS["count"] % 10_000 == 0:
        with open(REPORT, "a") as f:
            f.write(f"progress: {OPERATIONS['count']} operations\n")


def backends():
    """(name, arch, environment, fake library, its reset entry point) of each backend to run."""
    out = [("cpu", "cpu", {}, None, None), ("mock", "mock", {}, None, None)]
    if os.environ.get("KILN_TEST_FAKE_CUDA"):
        path = os.environ["KILN_TEST_FAKE_CUDA"]
        out.append(("cuda", "cuda", {"KILN_CUDA_DRIVER": path}, path, "kiln_fake_cuda_reset"))
    if os.environ.get("KILN_TEST_FAKE_HIP"):
        path = os.environ["KILN_TEST_FAKE_HIP"]
        out.append(("amdgpu", "amdgpu", {"KILN_HIP_RUNTIME": path}, path, "kiln_fake_hip_reset"))
    return out


class Live:
    """One live kiln.ndarray, its numpy model (None while its contents are unknown) and the bytes
    the ledger charged for it (nbytes, rounded up to the caching pool's size class)."""

    def __init__(self, array, model, accounted_bytes):
        self.array = array
        self.model = model
        self.accounted_bytes = accounted_bytes  # what its allocation added to allocated_bytes


def integral(model):
    """Whether every value of `model` is a whole number (what an array read before it was ever
    written may hold is arbitrary: its sums and products are not exact)."""
    if model.dtype.kind == "i":
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.isfinite(model)) and np.all(model == np.round(model)))


def exact_sum(model):
    """numpy's sum of `model` when every dtype sums it exactly (whole numbers, small enough),
    else None."""
    if not integral(model):
        return None
    total = np.abs(model.astype(np.float64)).sum()
    limit = (1 << 24) if model.dtype == np.float32 else (1 << 31) if model.dtype == np.int32 else (1 << 52)
    return model.astype(np.float64).sum() if total < limit else None


def one_d(n):
    return (n,)


def big_one_d(mib):
    """A 1-D shape of `mib` MiB in f64 (half that in the 4-byte dtypes)."""
    return ((mib * MiB) // 8,)


def random_shape(rng):
    """The numpy-RNG twin of KilnMachine.shapes (for bursts)."""
    kind = rng.integers(0, 3)
    if kind == 0:
        return tuple(int(d) for d in rng.integers(0, 10, size=rng.integers(1, 4)))
    if kind == 1:
        return one_d(int(rng.integers(1, 4097)))
    return big_one_d(int(rng.integers(1, 13)))


def random_fault(rng):
    return None if rng.integers(0, 2) == 0 else int(rng.integers(1, 5))


# What the rules draw: shapes (small, 1-D up to 4096, 1-D of several MiB so refusals happen) and an
# allocation fault armed at the N-th allocation of the step (or none).
SHAPES = st.one_of(
    st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple),
    st.integers(1, 4096).map(one_d),
    st.integers(1, 12).map(big_one_d),  # refusals happen
)
FAULTS = st.one_of(st.none(), st.integers(1, 4))
