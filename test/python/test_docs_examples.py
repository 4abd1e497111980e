"""Every ```python block of README.md and docs/*.md runs as written (each block in a fresh namespace, on the
CPU): an example that goes stale fails here."""
import pathlib
import re

import pytest

from conftest import SOURCE_DIR

DOCS = [pathlib.Path(SOURCE_DIR, "README.md")] + sorted(pathlib.Path(SOURCE_DIR, "docs").glob("*.md"))
BLOCKS = [(page, k, code) for page in DOCS
          for k, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S))]


def test_the_docs_have_python_examples():
    assert BLOCKS, "docs/*.md has no ```python block"


@pytest.mark.parametrize("page, index, code", BLOCKS, ids=[f"{p.name}-{k}" for p, k, _ in BLOCKS])
def test_a_docs_example_runs(page, index, code):
    if "from distributed import" in code:  # docs/dask.md: Debian's python3-distributed
        pytest.importorskip("distributed")
    exec(compile(code, f"{page.name} block {index}", "exec"), {"__name__": f"docs_{index}"})
