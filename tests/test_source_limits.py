"""The engine's layout rules (docs/engine.md, "Files"): no source file in csrc/
over 450 lines and no function over 70. A function is counted from its
signature to its closing brace, as it opens at namespace or class scope."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 70
# A brace that opens a scope, not a body: namespace, class, struct, enum, extern "C".
SCOPE = re.compile(r'\s*(template\s*<[^>]*>\s*)?(namespace\b|extern\s+""|class\b|struct\b|union\b|enum\b)')
BODY_AFTER_PARENS = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(->\s*[\w:<>]+\s*)?\{")


def sources():
    out = []
    for d, _, files in os.walk(CSRC):
        out += [os.path.join(d, f) for f in files if f.endswith((".h", ".cc"))]
    return sorted(out)


def _code(line):
    line = re.sub(r"//.*", "", line)
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    return re.sub(r"'(\\.|[^'\\])*'", "''", line)


def functions(lines):
    """(length, first line, signature) of each function body at namespace or class scope."""
    found, stack = [], []
    for i, line in enumerate(lines):
        code = _code(line)
        for ch in code:
            if ch == "{":
                scope = SCOPE.match(code) is not None and not BODY_AFTER_PARENS.search(code)
                stack.append((scope, i))
            elif ch == "}" and stack:
                scope, start = stack.pop()
                if not scope and all(s for s, _ in stack):
                    j = start  # back to the first line of the signature
                    while j > 0 and lines[j - 1].strip() and \
                            not lines[j - 1].strip().endswith((";", "}", "{")) and \
                            not lines[j - 1].strip().startswith(("//", "#")):
                        j -= 1
                    found.append((i - j + 1, j + 1, lines[j].strip()))
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: os.path.relpath(p, CSRC))
def test_source_within_limits(path):
    lines = open(path).read().split("\n")
    assert len(lines) - 1 <= MAX_FILE_LINES, \
        f"{path}: {len(lines) - 1} lines; split it by concept (at most {MAX_FILE_LINES})"
    long = [f"line {n}: {sig} ({length} lines)" for length, n, sig in functions(lines)
            if length > MAX_FUNCTION_LINES]
    assert not long, f"{path}: functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)


def test_function_counter_sees_bodies():
    text = ["namespace a {", "struct S {", "  int f() const {", "    return 1;", "  }", "};",
            "int g(int x)", "    {", "  return x;", "}", "}  // namespace a"]
    assert [(n, first) for n, first, _ in functions(text)] == [(3, 3), (4, 7)]
