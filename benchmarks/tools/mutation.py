"""Mutation testing of one module: change one operator or constant at a time, run the module's
own test files, count the mutants the tests kill (issue 45, item 6).

mutmut is the usual tool; this script does the same job in a form that suits ember's layout
(tests in a separate tree, torch imported by every test file) and a shared machine:

* the repository's ``ember/`` and ``tests/`` are copied once to a scratch folder and only the
  copy is mutated, so an interrupted run never leaves a changed source file behind;
* one parent process imports torch and pytest once (1 thread) and forks a child per mutant,
  which runs ``pytest -x`` on the given test files (a first failure is enough to kill it) with a
  per-mutant timeout (a mutant that hangs or loops counts as killed, reported apart);
* the operators are mutmut's classic ones: ``+``<->``-``, ``*``<->``/``, ``//``->``/``,
  ``%``->``/``, ``**``->``*``, ``<``<->``<=``, ``>``<->``>=``, ``==``<->``!=``, ``in``<->``not in``,
  ``is``<->``is not``, ``and``<->``or``, dropping a unary ``not`` / ``-``, a number ``n -> n + 1``,
  ``True``<->``False``. Strings (messages), docstrings, f-strings and annotations are left alone:
  a changed message or annotation is no behaviour change.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/tools/mutation.py ember/tasks/metrics/squad.py \\
        tests/tasks/metrics/test_squad_metrics.py [more test files] [--timeout 60] [--only 3,17]

It prints one line per surviving mutant (line, what changed) and the kill rate. ``--list``
only enumerates the mutants.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
          ast.FloorDiv: ast.Div, ast.Mod: ast.Div, ast.Pow: ast.Mult}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
           ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
           ast.And: "and", ast.Or: "or"}


def _skipped(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, f-strings, annotations (and all below them)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            roots.append(node)
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
    return {id(sub) for root in roots for sub in ast.walk(root)}


def _sites(tree: ast.AST) -> list[tuple[ast.AST, int, str]]:
    """Every (node, variant, description) one mutation can change, in a fixed walk order."""
    skip, sites = _skipped(tree), []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP:
            sites.append((node, 0, f"L{line}: {_SYMBOL[type(node.op)]} -> {_SYMBOL[_BINOP[type(node.op)]]}"))
        elif isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _CMP:
                    sites.append((node, k, f"L{line}: {_SYMBOL[type(op)]} -> {_SYMBOL[_CMP[type(op)]]}"))
        elif isinstance(node, ast.BoolOp):
            other = "or" if isinstance(node.op, ast.And) else "and"
            sites.append((node, 0, f"L{line}: {_SYMBOL[type(node.op)]} -> {other}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            sites.append((node, 0, f"L{line}: drop unary {'not' if isinstance(node.op, ast.Not) else '-'}"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            if isinstance(node.value, bool):
                sites.append((node, 0, f"L{line}: {node.value} -> {not node.value}"))
            else:
                sites.append((node, 0, f"L{line}: {node.value!r} -> {node.value + 1!r}"))
    return sites


class _Unary(ast.NodeTransformer):
    """Replaces one UnaryOp node by its operand (``not x`` -> ``x``, ``-x`` -> ``x``)."""

    def __init__(self, target: ast.AST):
        self.target = target

    def visit_UnaryOp(self, node):  # noqa: N802 (ast's naming)
        return node.operand if node is self.target else self.generic_visit(node)


def mutant_source(source: str, index: int) -> tuple[str, str]:
    """(source with mutation ``index`` applied, its description)."""
    tree = ast.parse(source)
    node, variant, what = _sites(tree)[index]
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BINOP[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[variant] = _CMP[type(node.ops[variant])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        tree = _Unary(node).visit(tree)
    elif isinstance(node.value, bool):
        node.value = not node.value
    else:
        node.value = node.value + 1
    return ast.unparse(ast.fix_missing_locations(tree)), what


def _run_tests(copy: Path, tests: list[str], timeout: float, select: str = "") -> str:
    """'passed' / 'failed' / 'timeout' of the test files in a forked child."""
    pid = os.fork()
    if pid == 0:  # child: quiet pytest in the scratch copy, stop at the first failure
        code = 1
        try:  # whatever happens, the child never returns into the parent's loop
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1), os.dup2(devnull, 2)
            os.chdir(copy)
            sys.path.insert(0, str(copy))
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # halves pytest's start-up; no test needs one
            import pytest
            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *(["-k", select] if select else []),
                                    *tests]))
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "passed" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", help="the module to mutate, e.g. ember/objectives/masking.py")
    ap.add_argument("tests", nargs="+", help="its own test files (paths from the repository root)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant (a hang = killed)")
    ap.add_argument("--only", default="", help="comma-separated mutant numbers to run")
    ap.add_argument("--lines", default="", help="only mutate these source lines, e.g. 113-166")
    ap.add_argument("-k", dest="select", default="", help="pytest -k expression (leave slow tests out)")
    ap.add_argument("--list", action="store_true", help="only list the mutants")
    args = ap.parse_args(argv)
    source = (ROOT / args.module).read_text()
    sites = _sites(ast.parse(source))
    low, _, high = args.lines.partition("-")
    wanted = [int(i) for i in args.only.split(",") if i] or [
        i for i, (node, _, _) in enumerate(sites)
        if not args.lines or int(low) <= node.lineno <= int(high or low)]
    count = len(sites)
    if args.list:
        for i in wanted:
            print(i, mutant_source(source, i)[1])
        return {"mutants": len(wanted)}
    sys.dont_write_bytecode = True  # a mutant of the same size and second must not reuse a .pyc
    import importlib
    import pytest  # noqa: F401  (imported once here, inherited by every forked child)
    import torch
    torch.set_num_threads(1)
    for heavy in ("numpy", "scipy.stats", "tokenizers", "hypothesis", "safetensors.torch"):
        try:  # third-party only: ember's own modules must be imported fresh, mutated
            importlib.import_module(heavy)
        except ImportError:
            pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the scratch copy is removed
    scratch = Path(tempfile.mkdtemp(prefix="ember-mutation-"))
    try:
        for part in ("ember", "tests"):
            shutil.copytree(ROOT / part, scratch / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")
        target = scratch / args.module
        start = time.monotonic()
        if _run_tests(scratch, args.tests, args.timeout * 3, args.select) != "passed":
            raise SystemExit("the tests fail on the unchanged module: fix them first")
        baseline = time.monotonic() - start
        print(f"{args.module}: {len(wanted)} mutants, tests {' '.join(args.tests)} ({baseline:.1f} s unmutated)",
              flush=True)
        outcome = {"killed": 0, "timeout": 0, "survived": 0}
        survivors = []
        for i in wanted:
            text, what = mutant_source(source, i)
            target.write_text(text)
            result = _run_tests(scratch, args.tests, max(args.timeout, 3 * baseline), args.select)
            key = {"failed": "killed", "timeout": "timeout", "passed": "survived"}[result]
            outcome[key] += 1
            if key == "survived":
                survivors.append((i, what))
                print(f"  survived #{i} {what}", flush=True)
        target.write_text(source)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total = sum(outcome.values())
    rate = 100.0 * (outcome["killed"] + outcome["timeout"]) / max(total, 1)
    print(f"{args.module}: killed {outcome['killed']} + timeout {outcome['timeout']} of {total}"
          f" = {rate:.1f}% ({outcome['survived']} survived) in {time.monotonic() - start:.0f} s", flush=True)
    return {"mutants": total, "rate": rate, "survivors": survivors, **outcome}


if __name__ == "__main__":
    main()
