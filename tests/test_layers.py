"""The house as docs/architecture.md draws it (issue 43, item 1): each sub-package of grpo_app imports only
from its own layer or the ones below, and no modules import each other in a circle. Reads the imports
(function-level ones too) with `ast`, so a change that reaches upward fails here, not in review."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "grpo_app"
# lowest first; a module may import from its own layer and any earlier one
LAYERS = ["core", "training", "evaluation", "export", "runs", "ui", "cli"]
LEVEL = {name: i for i, name in enumerate(LAYERS)}


def layer_of(mod: str) -> str | None:
    """'grpo_app.core.config' -> 'core'; 'grpo_app.cli' -> 'cli'; the package itself and __main__ -> None."""
    parts = mod.split(".")
    if len(parts) < 2 or parts[1] in ("__init__", "__main__"):
        return None
    return parts[1]


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        mod = ".".join(rel.parts).removesuffix(".__init__")
        pkg = mod.split(".") if p.name == "__init__.py" else mod.split(".")[:-1]
        deps = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom):
                if n.level:
                    base = ".".join(pkg[: len(pkg) - n.level + 1] + ([n.module] if n.module else []))
                else:
                    base = n.module or ""
                if base.startswith("grpo_app"):
                    deps.add(base)
                    deps |= {f"{base}.{a.name}" for a in n.names}
            elif isinstance(n, ast.Import):
                deps |= {a.name for a in n.names if a.name.startswith("grpo_app")}
        graph[mod] = deps
    return {m: {d for d in ds if d in graph and d != m} for m, ds in graph.items()}


def test_every_module_sits_in_a_declared_layer():
    stray = [m for m in import_graph() if layer_of(m) not in LEVEL and layer_of(m) is not None]
    assert not stray, f"modules outside the layers {LAYERS}: {stray} (move them into a sub-package)"


def test_no_import_reaches_up_a_layer():
    upward = []
    for mod, deps in import_graph().items():
        here = layer_of(mod)
        for d in deps:
            there = layer_of(d)
            if here in LEVEL and there in LEVEL and LEVEL[there] > LEVEL[here]:
                upward.append(f"{mod} -> {d}")
    assert not upward, "imports that reach up a layer:\n" + "\n".join(sorted(upward))


def test_no_circle_of_imports():
    graph = {m: {d for d in ds if d != "grpo_app"} for m, ds in import_graph().items()}

    def cycle(m, path):
        if m in path:
            return path[path.index(m):] + [m]
        for d in sorted(graph.get(m, ())):
            if c := cycle(d, path + [m]):
                return c
        return None

    found = next((c for m in sorted(graph) if (c := cycle(m, []))), None)
    assert found is None, " -> ".join(found)


def test_the_check_itself_sees_an_upward_import(tmp_path, monkeypatch):
    """The test can fail: a core module importing the engine is reported."""
    import shutil

    fake = tmp_path / "grpo_app"
    shutil.copytree(PKG, fake, ignore=shutil.ignore_patterns("__pycache__"))
    (fake / "core" / "config.py").write_text((fake / "core" / "config.py").read_text()
                                             + "\n\ndef _x():\n    from grpo_app.training.engine import train\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "PKG", fake)
    try:
        test_no_import_reaches_up_a_layer()
    except AssertionError as e:
        assert "grpo_app.core.config -> grpo_app.training.engine" in str(e)
    else:
        raise AssertionError("an upward import went unseen")
