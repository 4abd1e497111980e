"""Two broken variants of examples/testing/batching.py's score_batch, as a user might write them,
for test_testing_example.py (which swaps them in with monkeypatch). Import after putting
examples/testing on sys.path."""
import kiln

import batching

score_batch = batching.score_batch  # the correct one, before any test swaps it
kept: list = []


def leaking_score_batch(rows, weights):
    """Keeps the uploaded batch for a retry and forgets it when a later step fails: a failed
    batch leaves its ndarray held."""
    x = kiln.from_numpy(rows)
    kept.append(x)
    scores = kiln.matmul(x, weights)
    total = kiln.reduce_sum(scores)
    scores.free()
    kept.remove(x)
    x.free()
    return total


def wrapping_score_batch(rows, weights):
    """Wraps every failure in its own exception: the caller never sees the MemoryError, so it
    never halves the batch, and its caller gets a RuntimeError for an out-of-memory error."""
    try:
        return score_batch(rows, weights)
    except Exception as e:
        raise RuntimeError(f"batch of {len(rows)} rows failed") from e
