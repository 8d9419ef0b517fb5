"""`t5x-lite config show / explain / diff / reference`, gin error messages and unused-binding warnings."""

from __future__ import annotations

import copy
from pathlib import Path

import gin
import pytest

from t5x_lite import eval as eval_entry
from t5x_lite.config import command as config_command
from t5x_lite.config import parsing
from t5x_lite.config import reference as config_reference
from t5x_lite.config import resolve as config_resolve
from t5x_lite.training import optim

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def layered_config(tmp: Path) -> tuple[Path, Path]:
    """base.gin (includes the quickstart) sets the learning rate; top.gin includes base and sets it again."""
    base = write(tmp / "base.gin", "include 'runs/quickstart.gin'", "", "WarmupCosine.peak_learning_rate = 1e-2",
                 "TRAIN_STEPS = 50")
    top = write(tmp / "top.gin", "# the top file", "include 'base.gin'", "WarmupCosine.peak_learning_rate = 2e-2",
                "MODEL_DIR = 'elsewhere'")
    return base, top


def test_explain_names_file_and_line_of_each_override_in_include_order(in_tmp, capsys):
    _, top = layered_config(in_tmp)
    assert config_command.main(["explain", f"--gin_file={top.name}", "--gin.WarmupCosine.peak_learning_rate=3e-2",
                                "peak_learning_rate", "train_steps"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("WarmupCosine.peak_learning_rate = 0.03")
    assert out[at + 1] == "    set by   --gin.WarmupCosine.peak_learning_rate=3e-2"
    assert all(line.startswith("    overrode ") for line in out[at + 2:at + 6])
    # pretrain.gin (included by quickstart.gin) first, then quickstart.gin, base.gin, top.gin.
    sources = [line.split()[1] for line in out[at + 2:at + 6]]
    assert [Path(s.rsplit(":", 1)[0]).name for s in sources] == ["pretrain.gin", "quickstart.gin", "base.gin", "top.gin"]
    assert sources[2:] == ["base.gin:3", "top.gin:3"]
    pretrain = (parsing.builtin_gin_dir() / "runs" / "pretrain.gin").read_text().splitlines()
    line = int(sources[0].rsplit(":", 1)[1])
    assert pretrain[line - 1].startswith("WarmupCosine.peak_learning_rate")
    # A value set through a macro shows the binding that uses the macro, then the macro's own chain.
    at = out.index("train.train_steps = 50")
    assert out[at + 1].split()[2].endswith("pretrain.gin:" + str(_line_of(pretrain, "train.train_steps")))
    assert out[at + 2] == "    %TRAIN_STEPS = 50"
    assert out[at + 3] == "        set by   base.gin:4  TRAIN_STEPS = 50"
    assert [line.split()[1].rsplit("/", 1)[-1] for line in out[at + 4:at + 6]] == [
        f"pretrain.gin:{_line_of(pretrain, 'TRAIN_STEPS =')}", "quickstart.gin:13"]


def _line_of(lines: list[str], prefix: str) -> int:
    return next(i + 1 for i, line in enumerate(lines) if line.startswith(prefix))


def test_show_resolves_macros_and_marks_defaults(in_tmp, capsys):
    _, top = layered_config(in_tmp)
    assert config_command.main(["show", "--gin_file", top.name]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# train   (entry point)"
    assert "train.model_dir = 'elsewhere'" in out
    assert "train.model = @DecoderConfig()" in out
    assert "MODEL/DecoderConfig.num_layers = 4" in out  # gin calls a macro's value in the macro's scope
    assert "train.init_loss_tolerance = 1.0  # default" in out
    assert "train/DataConfig.split = 'train'" in out and "eval/DataConfig.split = 'validation'" in out


def test_unused_bindings_are_reported(in_tmp, capsys):
    _, top = layered_config(in_tmp)
    bindings = ["evl/DataConfig.split = 'x'", "MODLE = 3", "PerplexityEval.stride = 3", "DataConfig.shuffle = False"]
    # DataConfig.shuffle: both scoped calls (train/, eval/) bind shuffle themselves, so it never wins.
    resolved = config_resolve.load_run(gin_files=[top.name], gin_bindings=bindings)
    assert sorted(s.key for s in resolved.unused) == ["DataConfig.shuffle", "MODLE", "PerplexityEval.stride",
                                                       "evl/DataConfig.split"]
    config_command.print_unused_warnings(resolved)
    err = capsys.readouterr().err
    assert "DataConfig is called as train/DataConfig, eval/DataConfig, never in scope 'evl'" in err
    assert "MODLE (--gin.MODLE=3): no binding uses this macro; did you mean MODEL?" in err
    assert "this train run never calls PerplexityEval" in err


def test_a_binding_always_overridden_by_a_scoped_one_is_unused(in_tmp):
    _, top = layered_config(in_tmp)
    resolved = config_resolve.load_run(gin_files=[top.name], gin_bindings=["DataConfig.shuffle = False"])
    # pretrain.gin binds train/DataConfig.shuffle and eval/DataConfig.shuffle: the unscoped one never wins.
    assert [s.key for s in resolved.unused] == ["DataConfig.shuffle"]
    resolved = config_resolve.load_run(gin_files=[top.name], gin_bindings=["DataConfig.feature_converter = None"])
    assert resolved.unused == []  # no scoped binding of feature_converter: the unscoped one applies in both scopes


def test_jobs_warn_about_unused_bindings_before_they_start(in_tmp, capsys):

    with pytest.raises(SystemExit) as stopped:  # nothing to evaluate: exit 2, after the warning
        eval_entry.main(["--gin_file=runs/eval.gin", "--gin.MODEL_DIR='nowhere'", "--gin.MODEL_DIRR='x'"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "MODEL_DIRR (--gin.MODEL_DIRR='x'): no binding uses this macro; did you mean MODEL_DIR?" in err
    assert "In call to configurable" not in err  # gin's addition to the message is dropped


def test_static_resolution_matches_what_gin_calls(data_dir, in_tmp):
    """The walk from `train` finds exactly the calls (scope, configurable) and values gin makes."""
    write(in_tmp / "run.gin", "include 'runs/quickstart.gin'", f"DATA_DIR = '{data_dir}'",
          "train.eval_data = @eval/DataConfig()", "DataConfig.use_cached = False", "eval/DataConfig.seed = 7")
    resolved = config_resolve.load_run(gin_files=["run.gin"])
    selector = gin.config._REGISTRY.get_match("train").selector
    gin.clear_config(clear_constants=False)
    parsing.parse(gin_files=["run.gin"])
    for setting in resolved.settings.values():  # the macros load_run binds when nothing sets them
        if setting.binding.source.startswith("default ("):
            gin.parse_config(setting.binding.text)
    with gin.config._OPERATIVE_CONFIG_LOCK:
        gin.config._OPERATIVE_CONFIG.clear()
    # Evaluate train's arguments exactly as gin does just before calling it (deepcopy evaluates references).
    evaluated = copy.deepcopy(gin.config._get_bindings(selector))
    operative = {key: values for key, values in gin.config._OPERATIVE_CONFIG.items() if key[1] != "gin.macro"}
    ours = {("/".join(call.scope), call.configurable): params for call, params in resolved.calls[1:]}
    assert set(ours) == set(operative)
    for key, params in ours.items():
        assert {p.name for p in params} == set(operative[key])
        for p in params:  # gin records the value before evaluating references and macros
            expected = p.setting.binding.value if p.setting else p.value
            assert repr(expected) == repr(operative[key][p.name]), (key, p.name)
    assert resolved.values()["eval/DataConfig.seed"] == "7"
    # Building a value without gin gives what gin's own evaluation gives.
    train_params = {p.name: p for p in resolved.calls[0][1]}
    for name in ("model", "optimizer", "loss", "retention"):
        assert resolved.build(train_params[name].setting.binding.value) == evaluated[name], name
    built = resolved.build(train_params["train_data"].setting.binding.value, defer={"lm_task"})
    assert built.mixture_or_task_name == config_resolve.DeferredCall(
        "lm_task", {"name": "python_stdlib_lm", "data_dir": str(data_dir)})


def test_undefined_macro_names_file_line_and_nearest_macro(in_tmp):
    write(in_tmp / "typo.gin", "include 'runs/quickstart.gin'", "train.train_steps = %TRAIN_STEP")
    with pytest.raises(parsing.ConfigError, match=r"%TRAIN_STEP is used but never set\n  at typo.gin:2: "
                                                 r"train.train_steps = %TRAIN_STEP; did you mean %TRAIN_STEPS\b"):
        config_resolve.load_run(gin_files=["typo.gin"])


def test_unknown_reference_suggests_the_nearest_configurable(in_tmp):
    write(in_tmp / "ref.gin", "include 'runs/quickstart.gin'", "train.model = @DecodrConfig()")
    with pytest.raises(parsing.ConfigError) as e:
        parsing.parse(gin_files=["ref.gin"])
    message = str(e.value)
    assert 'In file "ref.gin", line 2' in message
    assert "Did you mean DecoderConfig" in message
    assert "DataConfig, DecoderConfig" in message.split("Configurables:")[1] and "macro" not in message.split(
        "Configurables:")[1]


def test_diff_of_two_model_directories_and_of_gin_files(in_tmp, capsys):
    for name, steps, lr in (("a", 10, "1e-3"), ("b", 20, "1e-3")):
        run_dir = in_tmp / name
        run_dir.mkdir()
        # A model directory's config.gin as a run writes it: gin's operative config, flattened.
        parsing.parse(gin_files=["runs/quickstart.gin"], gin_bindings=[f"TRAIN_STEPS = {steps}",
                                                                       f"WarmupCosine.peak_learning_rate = {lr}"])
        write(run_dir / "config.gin", _flattened_config())
    assert config_command.main(["diff", "a", "b"]) == 1
    assert capsys.readouterr().out.splitlines() == ["train.train_steps: 10 -> 20"]
    assert config_command.main(["diff", "a", "a"]) == 0
    assert capsys.readouterr().out.strip() == "no differences"
    write(in_tmp / "lr.gin", "include 'runs/quickstart.gin'", "WarmupCosine.peak_learning_rate = 1e-3",
          "TRAIN_STEPS = 10")
    assert config_command.main(["diff", "a", "lr.gin"]) == 0  # a directory and the gin files it came from agree
    assert capsys.readouterr().out.strip() == "no differences"


def _flattened_config() -> str:
    """Every binding with macros kept, as gin writes a config (gin.config_str of the parsed files)."""
    return gin.config_str()


@pytest.mark.parametrize("side, message", [("empty", "holds no config.gin"), ("missing.gin", "Unable to open file: missing.gin")])
def test_diff_of_something_that_is_not_a_config_is_an_error(in_tmp, capsys, side, message):
    (in_tmp / "empty").mkdir()
    with pytest.raises(SystemExit) as stopped:
        config_command.main(["diff", side, side])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_reference_is_up_to_date_and_every_parameter_documented():
    assert config_reference.missing_docs() == []
    committed = (ROOT / "docs" / "config_reference.md").read_text()
    assert committed == config_reference.render(), \
        "docs/config_reference.md is stale: t5x-lite config reference --out=docs/config_reference.md"


def test_reference_check_fails_on_a_missing_docstring_line(monkeypatch, tmp_path, capsys):
    doc = optim.WarmupCosine.__doc__
    monkeypatch.setattr(optim.WarmupCosine, "__doc__", "\n".join(
        line for line in doc.splitlines() if not line.strip().startswith("warmup_steps:")))
    assert config_reference.main([]) == 1
    assert "WarmupCosine.warmup_steps" in capsys.readouterr().err
    monkeypatch.setattr(optim.WarmupCosine, "__doc__", doc)
    stale = write(tmp_path / "ref.md", "old")
    assert config_reference.main([f"--out={stale}", "--check"]) == 1
    assert config_reference.main([f"--out={stale}"]) == 0
    assert config_reference.main([f"--out={stale}", "--check"]) == 0


def test_parameter_docs_reads_args_and_attributes_sections():
    doc = """Does a thing.

    Args:
      a: the first
        continued here.
      b / c: two at once.

    Returns:
      nothing: not a parameter.
    """
    assert config_reference.parameter_docs(doc) == {"a": "the first continued here.", "b": "two at once.",
                                                    "c": "two at once."}


def test_explain_shows_a_scoped_binding_winning_over_an_unscoped_one(in_tmp, capsys):
    assert config_command.main(["explain", "--gin_file=runs/quickstart.gin", "--gin.DataConfig.shuffle=False",
                                "DataConfig.shuffle"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("train/DataConfig.shuffle = True")
    assert out[at + 1].startswith("    set by   ")
    assert out[at + 1].endswith("train/DataConfig.shuffle = %SHUFFLE_TRAIN_EXAMPLES")
    assert out[at + 2] == "    %SHUFFLE_TRAIN_EXAMPLES = True"  # the macro's own chain, then what it beat
    assert out[at + 4] == "    wins over --gin.DataConfig.shuffle=False  (a less specific scope)"
