"""Every Python snippet of the README runs as written: those that need no GPU here (checking
each value a comment states and each printed block the text shows), the others on a GPU
(marked `gpu`). The bash snippets' `python -m cute_fa` commands are tests/test_packaging.py's."""

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)


def snippets() -> list:
    """(index, language, code, the plain block after it where the text between says it prints
    that, else None), in the README's order."""
    text = README.read_text()
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in FENCE.finditer(text)]
    out = []
    for i, (lang, code, _, end) in enumerate(blocks):
        printed = None
        if lang == "python" and "print(" in code and i + 1 < len(blocks):
            next_lang, next_code, next_start, _ = blocks[i + 1]
            between = text[end:next_start].strip()
            if next_lang == "" and between in ("", "prints"):
                printed = next_code
        out.append((i, lang, code, printed))
    return out


def python_snippets(gpu: bool) -> list:
    return [pytest.param(code, printed, id=f"block{i}") for i, lang, code, printed in snippets()
            if lang == "python" and ("cuda" in code) == gpu]


def stated_values(code: str) -> list:
    """(expression, value) of each line `expr  # value...` whose comment starts with a Python
    literal: what the README says the expression gives."""
    found = []
    for line in code.splitlines():
        if "  # " not in line or line.lstrip().startswith("#"):
            continue
        expr, comment = line.split("  # ", 1)
        expr = expr.strip()
        if not expr or "=" in expr.split("(")[0]:
            continue
        for end in range(len(comment), 0, -1):
            try:
                value = ast.literal_eval(comment[:end].strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
            if comment[:end].strip():
                found.append((expr, value))
            break
    return found


def test_the_readme_has_snippets_of_both_kinds():
    assert len(python_snippets(gpu=False)) >= 3 and len(python_snippets(gpu=True)) >= 4


def test_stated_values_are_read():
    """The comment parser finds the values the README states (so the check below can fail)."""
    code = 'L.f(0)[:2]    # [(0, 0), (0, 1)]   (query, key)\nL.g("Q", 1)   # 72: offset\nx = 1  # 3\n'
    assert stated_values(code) == [("L.f(0)[:2]", [(0, 0), (0, 1)]), ('L.g("Q", 1)', 72)]


@pytest.mark.parametrize("code, printed", python_snippets(gpu=False))
def test_cpu_snippet(code, printed):
    namespace: dict = {}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(code, str(README), "exec"), namespace)
    for expr, value in stated_values(code):
        assert eval(expr, namespace) == value, expr
    if printed is not None:
        assert stdout.getvalue() == printed


@pytest.mark.gpu
@pytest.mark.parametrize("code, printed", python_snippets(gpu=True))
def test_gpu_snippet(code, printed):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if "transformers" in code:
        pytest.importorskip("transformers")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    torch.cuda.synchronize()
    for expr, value in stated_values(code):
        assert eval(expr, namespace) == value, expr
