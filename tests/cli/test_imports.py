"""`import t5x_lite` stays cheap: no TensorFlow, no t5, no seqio until the data path needs them."""

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
    task modules; a user's own `tasks` package in the working directory neither hides them nor is
    hidden by them (the wheel installs no top-level `tasks`)."""
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
            "from t5x_lite.data import builtin_tasks\n"
            "d = parsing.builtin_gin_dir()\n"
            "print(d)\n"
            "parsing.parse(gin_files=['runs/quickstart.gin'])\n"
            "import gin; print(gin.query_parameter('DecoderConfig.num_layers'))\n"
            "print(builtin_tasks.folder())\n"
            "lm = builtin_tasks.load('lm')\n"
            "import tasks.my_tasks\n"
            "print(lm.__name__, tasks.my_tasks.OWNER.replace(' ', '_'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=user, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin",
                              "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    gin_dir, num_layers, tasks_dir, lm_name, owner = out.stdout.split()
    assert gin_dir == str(tmp_path / "site" / "t5x_lite" / "gin_configs")
    assert int(num_layers) > 0
    assert tasks_dir == str(tmp_path / "site" / "t5x_lite" / "builtin_tasks")
    assert (lm_name, owner) == ("t5x_lite_tasks.lm", "the_user")


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
