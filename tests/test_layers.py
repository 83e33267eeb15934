"""The package keeps its layers: no import cycles, and the pipeline's stages import only downward.

Every `import` in daemon/clawrl counts, also those inside functions (a lazy import hides a cycle,
it does not remove it). The stages, upstream first: the chat format, the turn log and the
engines know nothing of serving, judging, learning or hot-swap; learning knows nothing of
serving. The adapters folder's format (adapters/versions.py) and the base modules (config, types,
errors, ...) are contracts that any stage may read.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "daemon" / "clawrl"

# A stage is a package (its modules' prefix); hot-swap is adapters/swap.py alone, because the
# versions folder's format (adapters/versions.py) is a contract that every stage reads.
STAGES = {
    "chat": "clawrl.chat", "turnlog": "clawrl.turnlog", "engines": "clawrl.engines",
    "serve": "clawrl.serve", "judge": "clawrl.judge", "learn": "clawrl.learn",
    "swap": "clawrl.adapters.swap",
}
# Who may not import whom.
FORBIDDEN = {
    "chat": {"serve", "judge", "learn", "swap"},
    "turnlog": {"serve", "judge", "learn", "swap"},
    "engines": {"serve", "judge", "learn", "swap"},
    "learn": {"serve"},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """The clawrl modules `path` imports, resolved to module names (a `from pkg import name`
    counts as importing pkg.name when that is a module)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("clawrl")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("clawrl"):
                target = node.module
            else:
                continue
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in imports(p) if i in files and i != m} for m, p in files.items()}


def stage(module: str) -> str | None:
    for name, prefix in STAGES.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None


def test_there_are_no_import_cycles():
    g = graph()
    reach: dict[str, set[str]] = {}

    def reachable(m: str) -> set[str]:
        if m not in reach:
            reach[m], todo = set(), list(g[m])
            while todo:
                n = todo.pop()
                if n not in reach[m]:
                    reach[m].add(n)
                    todo += g[n]
        return reach[m]
    cycles = sorted({tuple(sorted((a, b))) for a in g for b in g[a] if a in reachable(b)})
    assert cycles == [], f"modules that reach each other: {cycles}"


def test_stages_import_only_downstream_of_themselves():
    wrong = [(m, i) for m, deps in graph().items() for i in deps
             if stage(i) in FORBIDDEN.get(stage(m), set())]
    assert wrong == [], f"imports against the layers: {wrong}"


def test_every_module_is_read():
    # The check is live: it sees the package's modules and their imports.
    g = graph()
    assert len(g) > 50 and "clawrl.engines.base" in g["clawrl.engines.remote"]
    assert "clawrl.learn.step" in g["clawrl.learn.trainer"]
