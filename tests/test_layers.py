"""The package keeps its layers: no import cycles, and the pipeline's stages import only downward.

Every `import` in daemon/clawrl counts, also those inside functions (a lazy import hides a cycle,
it does not remove it). The stages, upstream first: the chat format, the turn log and the
engines know nothing of serving, judging, learning or hot-swap; learning knows nothing of
serving. The adapters folder's format (adapters.py) and the base modules (config, types,
errors, ...) are contracts that any stage may read.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "daemon" / "clawrl"

STAGES = {
    "chat": {"chat_format", "chat_request", "toolcalls", "reasoning"},
    "turnlog": {"store", "migrations", "redact", "forget"},
    "engines": {"engines"},
    "serve": {"server", "proxy", "control", "access", "openapi", "dashboard", "skills_api",
              "sdnotify", "httpjson"},
    "judge": {"judge", "judging", "probe", "probe_fit", "feedback_corpus", "judge_eval"},
    "learn": {"trainer", "tinker_trainer", "train_step", "samples", "teacher", "advantages",
              "distributed", "supervisor", "remote_teacher"},
    "swap": {"swap"},
    # adapters.py, the versions folder's format, is a contract every stage reads: no stage.
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
    parts = module.split(".")[1:]
    for name, members in STAGES.items():
        if parts and parts[0] in members:
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
    assert "clawrl.train_step" in g["clawrl.trainer"]
