"""`import t5x_lite` stays cheap: no TensorFlow, no t5, no seqio until the data path needs them."""

import ast
import subprocess
import sys

from tests.cli_helpers import ROOT


def test_import_does_not_pull_in_tensorflow_or_t5():
    code = ("import sys, t5x_lite, t5x_lite.cli, t5x_lite.config\n"
            "print(sorted(m for m in ('tensorflow', 't5', 'seqio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "t5x_lite.cli", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    for command in ("prepare", "train", "eval", "infer", "sample", "checkpoint"):
        assert command in out.stdout


def test_an_installed_wheel_finds_its_gin_files_and_tasks_beside_a_users_own_tasks_package(tmp_path):
    """Built and installed outside the checkout, the package still finds runs/quickstart.gin and its
    task modules (t5x_lite.data.tasks); a user's own `tasks` package in the working directory neither
    hides them nor is hidden by them (the wheel installs no top-level `tasks`)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "wheel"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "wheel").glob("t5x_lite-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(tmp_path / "site"), str(wheel)], check=True, capture_output=True)
    assert not (tmp_path / "site" / "tasks").exists()
    user = tmp_path / "user"
    (user / "tasks").mkdir(parents=True)
    (user / "tasks" / "__init__.py").write_text("")
    (user / "tasks" / "my_tasks.py").write_text("OWNER = 'the user'\n")
    code = ("from t5x_lite.config import parsing\n"
            "d = parsing.builtin_gin_dir()\n"
            "print(d)\n"
            "parsing.parse(gin_files=['runs/quickstart.gin'])\n"
            "import gin; print(gin.query_parameter('DecoderConfig.num_layers'))\n"
            "from t5x_lite.data.tasks import lm\n"
            "print(lm.__file__)\n"
            "import tasks.my_tasks\n"
            "print(lm.__name__, tasks.my_tasks.OWNER.replace(' ', '_'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=user, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin",
                              "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    gin_dir, num_layers, lm_file, lm_name, owner = out.stdout.split()
    assert gin_dir == str(tmp_path / "site" / "t5x_lite" / "gin_configs")
    assert int(num_layers) > 0
    assert lm_file == str(tmp_path / "site" / "t5x_lite" / "data" / "tasks" / "lm.py")
    assert (lm_name, owner) == ("t5x_lite.data.tasks.lm", "the_user")


# Names that load code by a string, which neither grimp nor lint-imports can follow.
_LOADERS = {"import_module", "__import__", "spec_from_file_location", "spec_from_loader", "module_from_spec",
            "exec_module", "load_module", "SourceFileLoader", "run_module", "run_path"}
# The one call that may: a user's module of task registrations (MIXTURE_OR_TASK_MODULE).
_ALLOWED_LOADERS = {("t5x_lite/data/task_modules.py", "import_task_module")}
# Optional third-party packages imported by name, never the package's own modules.
_EXTRA_LOADER = ("t5x_lite/metrics/tracking.py", "import_extra")


def _loaders(source: str, path: str) -> list[tuple[str, str]]:
    """(path, enclosing function) of each use of an importlib-style loader in `source`."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                else None)
        if name in _LOADERS:
            found.append((path, function))
        if isinstance(node, ast.ImportFrom):
            found.extend((path, function) for alias in node.names if alias.name in _LOADERS)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_the_loader_finder_finds_importlib_calls():
    assert _loaders("import importlib\ndef f(n):\n    return importlib.import_module(n)\n", "a.py") == [("a.py", "f")]
    assert _loaders("from importlib.util import spec_from_file_location as s\n", "b.py") == [("b.py", "<module>")]
    assert _loaders("x = __import__('os')\n", "c.py") == [("c.py", "<module>")]
    assert _loaders("import os\nfrom t5x_lite.data.preparation import prepare\n", "d.py") == []


def test_package_code_is_imported_by_import_statements_never_loaded_through_importlib():
    """Every import of the package's own code is an `import` statement (inside a function where it
    must be lazy), so the cycle check above and lint-imports see every edge."""
    found = set()
    for path in sorted((ROOT / "t5x_lite").rglob("*.py")):
        found.update(_loaders(path.read_text(), str(path.relative_to(ROOT))))
    assert found - _ALLOWED_LOADERS - {_EXTRA_LOADER} == set()
    # import_extra loads a metric writer's optional package: its callers name third-party packages.
    calls = [node for path in (ROOT / "t5x_lite").rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == _EXTRA_LOADER[1]]
    assert calls and all(isinstance(c.args[0], ast.Constant) and not c.args[0].value.startswith("t5x_lite")
                         for c in calls)


def test_every_verb_imports_the_module_its_command_table_names():
    from t5x_lite import cli

    assert {command: cli.verb_module(command).__name__ for command in cli.COMMANDS} == {
        command: module for command, (module, _) in cli.COMMANDS.items()}


def _own_import_graph():
    """{module: modules of the package it imports}, imports inside functions included (grimp reads them all)."""
    import grimp

    graph = grimp.build_graph("t5x_lite")
    return {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), i.e. the import cycles."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_even_through_imports_inside_functions():
    graph = _own_import_graph()
    assert len(graph) > 50  # the whole package was read
    assert _cycles(graph) == []


def test_modules_are_small_and_the_top_level_is_short():
    package = ROOT / "t5x_lite"
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in package.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > 500} == {}
    assert len(list(package.glob("*.py"))) <= 15
