"""docs/settings.md is the one reference for every setting.

The source (csrc/, hvdlite/, launcher/ and the engine's build) is scanned for
the HVDLITE_* / HOROVOD_* variables it reads or sets; each must have a row,
each row must name a variable the code still reads, and each hvdrun flag a row
gives must exist and set that variable. For the engine's variables the
accepted values and defaults in the rows are checked against the code that
parses them. Runs without MPI or an engine."""

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "docs", "settings.md")
PACKAGE_DIRS = ("csrc", "hvdlite", "launcher")
BUILD_FILES = ("build_engine.py", "setup.py")
TEST_DIRS = ("tests", "scripts")
ENGINE_OPTIONS = os.path.join(ROOT, "csrc", "engine", "engine_options.cc")
OPTION_HEADERS = [os.path.join(ROOT, "csrc", "engine", "engine_options.h"),
                  os.path.join(ROOT, "csrc", "transport", "wire_options.h")]
AUTOTUNER = os.path.join(ROOT, "csrc", "tuning", "autotuner.cc")
DEVICE = os.path.join(ROOT, "hvdlite", "torch", "device.py")

NAME = re.compile(r"(?:HVDLITE|HOROVOD)_[A-Z0-9_]*[A-Z0-9]")
PREFIX = re.compile(r"(?:HVDLITE|HOROVOD)_(?:[A-Z0-9_]*_)?")
CPP_EXTENSIONS = (".cc", ".h", ".cpp", ".cu")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _files(top, extensions):
    for d, dirs, files in os.walk(os.path.join(ROOT, top)):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "__")))
        for f in sorted(files):
            if f.endswith(extensions):
                yield os.path.join(d, f)


# ---- C++ ------------------------------------------------------------------------

_CPP_TOKEN = re.compile(r'("(?:\\.|[^"\\\n])*")|(//[^\n]*)|(/\*.*?\*/)', re.S)


def _strip_cpp_comments(text):
    return _CPP_TOKEN.sub(lambda m: m.group(1) or " ", text)


def _balanced(text, start):
    """The text between the bracket at `start` and its partner."""
    pairs = {"(": ")", "{": "}"}
    opener, closer, depth = text[start], pairs[text[start]], 0
    for i in range(start, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    raise ValueError("unbalanced %s at %d" % (opener, start))


def _split_args(args):
    """Top-level comma-separated arguments of a call."""
    out, depth, current = [], 0, ""
    for token in re.split(r'("(?:\\.|[^"\\])*"|[(){},])', args):
        if token in ("(", "{"):
            depth += 1
        elif token in (")", "}"):
            depth -= 1
        if token == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += token
    out.append(current.strip())
    return out


def suffix_reads(text):
    """Calls of helpers that take a variable's name without its prefix.

    The engine reads each setting as HVDLITE_<suffix>, else HOROVOD_<suffix>
    (engine_options.cc: Lookup tries both prefixes), through helpers whose
    first parameter is `const std::string& suffix`; returns
    [(helper, suffix, [other arguments])]."""
    helpers = set(re.findall(r"\b(\w+)\s*\(\s*const\s+std::string\s*&\s*suffix\b", text))
    if not helpers:
        return []
    call = re.compile(r"\b(%s)\s*(?:<[\w:]+>)?\s*\(" % "|".join(sorted(helpers)))
    reads = []
    for m in call.finditer(text):
        args = _split_args(_balanced(text, m.end() - 1))
        literal = re.fullmatch(r'"([A-Z0-9_]+)"', args[0])
        if literal:
            reads.append((m.group(1), literal.group(1), args[1:]))
    return reads


def cpp_names(path):
    """(names, unexpanded prefixes) a C++ file reads."""
    text = _strip_cpp_comments(_read(path))
    literals = re.findall(r'"((?:\\.|[^"\\\n])*)"', text)
    names = {s for s in literals if NAME.fullmatch(s)}
    prefixes = sorted({s for s in literals if PREFIX.fullmatch(s)})
    if not prefixes:
        return names, []
    reads = suffix_reads(text)
    if not reads:
        return names, ["%s: %s" % (os.path.relpath(path, ROOT), p) for p in prefixes]
    names |= {p + suffix for p in prefixes for _, suffix, _ in reads}
    return names, []


# ---- Python ---------------------------------------------------------------------

def _docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _expand_prefix(node, parents):
    """`"HVDLITE_X_" + flag.upper()` inside `for flag in ("a", "b")`: the names
    it builds, or None where the scanner cannot tell."""
    parent = parents.get(id(node))
    if not (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add) and parent.left is node):
        return None
    right = parent.right
    if not (isinstance(right, ast.Call) and isinstance(right.func, ast.Attribute)
            and right.func.attr == "upper" and isinstance(right.func.value, ast.Name)):
        return None
    var = right.func.value.id
    up = parents.get(id(parent))
    while up is not None:
        if isinstance(up, ast.For) and isinstance(up.target, ast.Name) and up.target.id == var:
            if isinstance(up.iter, (ast.Tuple, ast.List)) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in up.iter.elts):
                return {node.value + e.value.upper() for e in up.iter.elts}
            return None
        up = parents.get(id(up))
    return None


def python_names(path):
    """(names, unexpanded prefixes) a Python file reads or sets: string
    constants that are a whole variable name (docstrings aside), keyword
    arguments named like one (`env.update(HVDLITE_X=...)`), and names built
    from a prefix by a rule `_expand_prefix` knows."""
    tree = ast.parse(_read(path), path)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    skip = _docstrings(tree)
    names, unexpanded = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
            names.add(node.arg)
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        if NAME.fullmatch(node.value):
            names.add(node.value)
        elif PREFIX.fullmatch(node.value):
            built = _expand_prefix(node, parents)
            if built is None:
                unexpanded.append("%s:%d: %s" % (os.path.relpath(path, ROOT), node.lineno, node.value))
            else:
                names |= built
    return names, unexpanded


def scan(paths):
    names, unexpanded = {}, []
    for path in paths:
        found, left = (cpp_names if path.endswith(CPP_EXTENSIONS) else python_names)(path)
        for n in found:
            names.setdefault(n, os.path.relpath(path, ROOT))
        unexpanded += left
    return names, unexpanded


def package_sources():
    paths = [p for top in PACKAGE_DIRS for p in _files(top, CPP_EXTENSIONS + (".py",))]
    return paths + [os.path.join(ROOT, f) for f in BUILD_FILES if os.path.exists(os.path.join(ROOT, f))]


CODE, UNEXPANDED = scan(package_sources())


# ---- docs/settings.md -------------------------------------------------------------

def _cells(line):
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def reference_tables(path=REFERENCE):
    """[(heading, [row dict by column name])] of every table in the page."""
    tables, heading, header, rows = [], "", None, None
    for line in _read(path).splitlines() + [""]:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|"):
            cells = _cells(line)
            if header is None:
                header, rows = [c.strip("`").lower() for c in cells], []
            elif not all(set(c) <= set("-: ") for c in cells):
                rows.append(dict(zip(header, cells)))
        elif header is not None:
            tables.append((heading, rows))
            header = None
    return tables


def _backticked(cell):
    return re.findall(r"`([^`]*)`", cell)


def reference_rows():
    """{variable: row} of the main tables; {variable: row} of the test suite's."""
    main, tests = {}, {}
    for heading, rows in reference_tables():
        target = tests if "test suite" in heading.lower() else main
        for row in rows:
            for name in _backticked(row["variable"]):
                assert NAME.fullmatch(name), "not a variable name in docs/settings.md: %r" % name
                assert name not in main and name not in tests, "two rows for %s" % name
                target[name] = row
    return main, tests


ROWS, TEST_ROWS = reference_rows()


def _alias(name):
    return "HOROVOD_" + name[len("HVDLITE_"):] if name.startswith("HVDLITE_") else None


def documented():
    names = set(ROWS)
    names |= {_alias(n) for n, row in ROWS.items() if row["horovod_"] == "yes"}
    return names


def test_reference_has_rows():
    assert len(ROWS) > 40 and TEST_ROWS


def test_every_built_name_is_understood():
    assert not UNEXPANDED, (
        "variable names built from a prefix that this test cannot expand; add a rule to "
        "_expand_prefix (Python) or suffix_reads (C++): %s" % UNEXPANDED)


@pytest.mark.parametrize("name", sorted(CODE))
def test_variable_read_in_code_has_a_row(name):
    if name in documented():
        return
    hint = ""
    if name.startswith("HOROVOD_") and "HVDLITE_" + name[len("HOROVOD_"):] in ROWS:
        hint = " (its HVDLITE_ row should say yes in the `HOROVOD_` column)"
    pytest.fail("%s (read in %s) has no row in docs/settings.md%s" % (name, CODE[name], hint))


@pytest.mark.parametrize("name", sorted(ROWS))
def test_row_names_a_variable_the_code_reads(name):
    if name not in CODE:
        pytest.fail("docs/settings.md has a row for %s, which no code reads any more" % name)
    alias = _alias(name)
    says = ROWS[name]["horovod_"]
    assert says in ("yes", "—"), "%s: the `HOROVOD_` column says %r (yes or —)" % (name, says)
    reads_alias = alias is not None and alias in CODE
    assert (says == "yes") == reads_alias, (
        "%s: the code %s %s, the row's `HOROVOD_` column says %s" % (
            name, "reads" if reads_alias else "does not read", alias, says))


@pytest.mark.parametrize("name", sorted(TEST_ROWS))
def test_test_suite_row_names_a_variable_the_tests_read(name):
    assert name not in CODE, "%s is read by the package: its row belongs in the main tables" % name
    pattern = re.compile(r"\b%s\b" % name)
    for top in TEST_DIRS:
        for path in _files(top, (".py", ".sh")):
            if path != os.path.abspath(__file__) and pattern.search(_read(path)):
                return
    pytest.fail("docs/settings.md's test suite table has %s, which nothing in %s reads"
                % (name, ", ".join(TEST_DIRS)))


# ---- hvdrun's flags ---------------------------------------------------------------

def _launcher_options():
    sys.path.insert(0, ROOT)
    try:
        from launcher import options
    finally:
        sys.path.remove(ROOT)
    return options


FLAG_ROWS = sorted((name, flag) for name, row in ROWS.items()
                   for cell in _backticked(row["hvdrun flag"]) for flag in [cell.split()[0]]
                   if flag.startswith("-"))


def _sample_value(action):
    if action.nargs == 0:
        return []
    if action.choices:
        return [list(action.choices)[0]]
    return ["1"] if action.type in (int, float) else ["value"]


@pytest.mark.parametrize("name,flag", FLAG_ROWS)
def test_hvdrun_flag_sets_the_variable(name, flag, monkeypatch):
    options = _launcher_options()
    parser = options.build_parser()
    action = parser._option_string_actions.get(flag)
    assert action is not None, "docs/settings.md: %s's flag %s is not an hvdrun flag" % (name, flag)
    monkeypatch.delenv(name, raising=False)
    opts = options.parse_args([flag] + _sample_value(action) + ["-np", "1", "true"])
    if name in opts.rank_env:
        return
    # Not set in the ranks: the flag's default must come from the variable.
    monkeypatch.setenv(name, "7")
    assert options.build_parser().get_default(action.dest) == 7, (
        "hvdrun %s neither sets %s in the ranks nor takes its default from it" % (flag, name))


# ---- the engine's values and defaults ---------------------------------------------

def engine_reads():
    """{variable: (helper, other arguments)} of engine_options.cc."""
    return {"HVDLITE_" + suffix: (helper, args)
            for helper, suffix, args in suffix_reads(_strip_cpp_comments(_read(ENGINE_OPTIONS)))}


ENGINE_READS = engine_reads()
# A variable without a row fails test_variable_read_in_code_has_a_row; these
# check only the rows there are.
ENGINE_ROWS = sorted(set(ENGINE_READS) & set(ROWS))


def _accepted_values(helper, args):
    """The fragments the row's accepted-values cell must contain."""
    if helper in ("ReadInt", "ReadDouble"):
        minimum = float(args[0])
        return ["%s ≥ %g" % ("integer" if helper == "ReadInt" else "number", minimum)]
    if helper == "ReadBool":
        return ["`0`", "`1`"]
    if helper == "ReadChoice":
        return ["`auto`", "`0`", "`1`"]
    if helper == "ReadNamed":
        return ["`%s`" % v for v in re.findall(r'\{\s*"([^"]+)"\s*,', args[0])]
    return []  # Lookup: a path, free text


@pytest.mark.parametrize("name", ENGINE_ROWS)
def test_engine_accepted_values(name):
    helper, args = ENGINE_READS[name]
    cell = ROWS[name]["accepted values"]
    for fragment in _accepted_values(helper, args):
        assert fragment in cell, "%s: the engine takes %s (%s), the row says %r" % (
            name, fragment, helper, cell)


def option_structs():
    """{struct: {member: (type, default expression or None)}} of the option headers."""
    structs = {}
    for path in OPTION_HEADERS:
        text = _strip_cpp_comments(_read(path))
        for m in re.finditer(r"\bstruct\s+(\w+)\s*\{", text):
            body = _balanced(text, m.end() - 1)
            # A struct defined inside another is a member of its type.
            body = re.sub(r"struct\s+(\w+)\s*\{[^{}]*\}\s*(\w+)\s*;", r"\1 \2;", body)
            members = {}
            for statement in body.split(";"):
                statement = " ".join(statement.split())
                d = re.fullmatch(r"(?:public:|private:)?\s*([\w:<>]+) (\w+)(?: = (.+))?", statement)
                if d and "(" not in statement:
                    members[d.group(2)] = (d.group(1), d.group(3))
            structs[m.group(1)] = members
    return structs


def _value(expression):
    expression = expression.strip()
    if expression in ("true", "false"):
        return float(expression == "true")
    enum = re.fullmatch(r"\w+::k(\w+)", expression)
    if enum:
        return enum.group(1).lower()
    assert re.fullmatch(r"[\d.\s*+-]+", expression), "cannot read the default %r" % expression
    return float(eval(expression))  # digits and arithmetic only (checked above)


def engine_default(target):
    """The default of the field `target` (`&o.shm.chunk_bytes`, or a local)."""
    m = re.fullmatch(r"&o\.([\w.]+)", target)
    if not m:  # a local of FromEnvironment, e.g. `bool stall_disabled = false;`
        local = re.search(r"\b\w+ %s = ([^;]+);" % re.escape(target.lstrip("&")), _read(ENGINE_OPTIONS))
        assert local, "cannot find the default of %s" % target
        return _value(local.group(1))
    structs, struct = option_structs(), "EngineOptions"
    path = m.group(1).split(".")
    for member in path[:-1]:
        struct = structs[struct][member][0]
    expression = structs[struct][path[-1]][1]
    assert expression is not None, "%s has no default in the headers" % target
    return _value(expression)


def _row_default(cell):
    number = re.match(r"[\d.]+", cell)
    return float(number.group(0)) if number else cell.split()[0].strip("`")


# Lookup: a path or free text; ReadInterfaces: a list, empty by default.
@pytest.mark.parametrize("name", [n for n in ENGINE_ROWS if ENGINE_READS[n][0] not in ("Lookup", "ReadInterfaces")])
def test_engine_default(name):
    _, args = ENGINE_READS[name]
    code = engine_default(args[-1])
    row = ROWS[name]["default"]
    assert _row_default(row) == code, "%s: the engine's default is %r, the row says %r" % (name, code, row)


def test_autotune_log_columns():
    """The CSV header autotuner.cc writes is the one the reference gives."""
    text = _strip_cpp_comments(_read(AUTOTUNER))
    m = re.search(r"std::fprintf\(log_,\s*((?:\"[^\"]*\"\s*)+)\)", text)
    header = "".join(re.findall(r'"([^"]*)"', m.group(1))).replace("\\n", "")
    assert "`%s`" % header in ROWS["HVDLITE_AUTOTUNE_LOG"]["what it does"]


def test_device_transport_values():
    """hvdlite.torch's MODES, without importing torch."""
    tree = ast.parse(_read(DEVICE))
    modes = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "MODES" for t in node.targets))
    cell = ROWS["HVDLITE_DEVICE_TRANSPORT"]["accepted values"]
    assert _backticked(cell) == list(modes), cell
    assert _row_default(ROWS["HVDLITE_DEVICE_TRANSPORT"]["default"]) == "auto"
