"""The package's floors, checked on every import statement (module level and inside functions).

DESIGN.md's dependency direction: ``nn`` <- ``models`` <- ``objectives``/``tasks`` <- ``train`` <-
``commands``, with run folders (``ember.runs``) as a bottom floor that never imports the trainer.
A lazy import inside a function is still a dependency, so it counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ember

ROOT = Path(ember.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the ember modules it imports (a package import counts as its __init__)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from ember.x import y` may name a submodule y or an attribute of ember.x
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in names:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith("ember") and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floor(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


# (importing floor, imported floor): a dependency pointing the wrong way.
FORBIDDEN = [
    ("nn", "models"), ("nn", "objectives"), ("nn", "tasks"), ("nn", "train"),
    ("models", "objectives"), ("models", "tasks"), ("models", "train"),
    ("runs", "train"), ("runs", "tasks"), ("runs", "objectives"), ("runs", "serve"),
    ("tasks", "train"), ("objectives", "train"), ("interop", "train"), ("serve", "train"),
    ("distillation", "commands"), ("serve", "commands"), ("tasks", "serve"), ("train", "serve"),
    # the public functions (ember.api) sit above the engine and serving; the experiments above them
    *[(low, "api") for low in ("nn", "models", "objectives", "tasks", "runs", "train", "serve", "interop",
                               "distillation", "data", "tokenizers", "knowledge")],
    *[(low, "experiments") for low in ("nn", "models", "objectives", "tasks", "runs", "train", "serve",
                                       "interop", "distillation", "api", "knowledge")],
    # knowledge graphs (K-BERT, ERNIE) sit beside tasks and objectives, on nn/models: the tasks
    # and the ernie objective use them, they use neither (nor the trainer)
    *[("knowledge", high) for high in ("tasks", "objectives", "train", "serve", "interop", "distillation",
                                       "runs")],
    *[(low, "knowledge") for low in ("nn", "models", "runs", "data", "tokenizers")],
    # decoding, tasks, serving and interop run models, never a pre-training objective (a GPT run
    # loads as ember.models.decoder.CausalLM, T5's head is the backbone's lm_logits)
    *[(low, "objectives") for low in ("generate", "seq2seq_generation", "tasks", "serve", "interop")],
]


def test_no_import_cycles_between_ember_modules():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_floors():
    bad = []
    for module, targets in import_graph().items():
        for target in targets:
            if (floor(module), floor(target)) in FORBIDDEN:
                bad.append(f"{module} -> {target}")
            # the library never reaches up into the command-line layer
            if floor(target) == "commands" and floor(module) not in ("commands", "cli", "__main__"):
                bad.append(f"{module} -> {target} (library -> CLI)")
    assert not bad, "imports against the floors:\n" + "\n".join(sorted(bad))


def test_layering_check_sees_lazy_imports(tmp_path):
    """The checker itself: an import inside a function is an edge (or cycles would hide there)."""
    graph = import_graph()
    assert "ember.runs.checkpoint" in graph["ember.runs.init"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def task_room(module: str) -> str:
    """The room of a module inside ember.tasks: a sub-package's name, or 'adapters' for the
    modules at its top (heads, adapters, registry and their shared plumbing)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 else "adapters"


# Inside ember.tasks (each sub-package's docstring says the same): readers at the bottom, then
# metrics, then inference methods; heads/adapters, families and text to text above them.
TASK_ROOMS_BELOW = {
    "readers": set(),
    "metrics": {"readers"},
    "inference": {"readers", "metrics"},
}
# the plumbing at the top of ember.tasks that the lower rooms may use (no head or adapter)
TASK_PLUMBING = {"ember.tasks.batching", "ember.tasks.featurize", "ember.tasks.wrapped"}


def test_task_rooms_import_only_the_rooms_below():
    bad = []
    for module, targets in import_graph().items():
        if not module.startswith("ember.tasks.") or task_room(module) not in TASK_ROOMS_BELOW:
            continue
        allowed = TASK_ROOMS_BELOW[task_room(module)] | {task_room(module)}
        for target in targets:
            if not target.startswith("ember.tasks") or target in TASK_PLUMBING:
                continue
            if target == "ember.tasks" or task_room(target) not in allowed:
                bad.append(f"{module} -> {target}")
    # the readers read: not even the shared featurization
    bad += [f"{m} -> {t}" for m, ts in import_graph().items() if m.startswith("ember.tasks.readers")
            for t in ts if t in TASK_PLUMBING]
    assert not bad, "imports against the rooms of ember.tasks:\n" + "\n".join(sorted(bad))


def test_task_registry_names_modules_that_exist():
    """base.py's registry is strings ("module:Class"), so a move that forgets one fails only when
    that task is asked for: import every entry here."""
    import importlib

    from ember.tasks import base
    from ember.tasks.inference import pretrained

    targets = [*base.LAZY_ADAPTERS.values(), *base.CUSTOM_TASKS.values(), *base.FAMILY_ADAPTERS.values(),
               base.LANGUAGE_ADAPTER, *pretrained.PRETRAINED.values()]
    for target in targets:
        module_name, _, attribute = target.partition(":")
        assert hasattr(importlib.import_module(module_name), attribute), target
