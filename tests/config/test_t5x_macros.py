"""t5x's macros mean what they mean in t5x, or are refused naming the equivalent (config/t5x_macros.py);
USE_CACHED_TASKS on a task with no offline cache stops with one line naming the cache command.

Each bound macro is checked where it lands: the value the call would receive, read from the
resolved gin config without running anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from t5x_lite.config import command as config_command
from t5x_lite.config import entry, parsing, t5x_macros
from t5x_lite.config import resolve as config_resolve
from t5x_lite.config.t5x_macros import T5X_MACROS
from tests.cli.test_bad_input import assert_bad_input
from tests.cli_helpers import ROOT, run_cli_in_process

TRAIN = ["--gin.MODEL_DIR='/tmp/unused'", "--gin.TRAIN_STEPS=5", "--gin.MIXTURE_OR_TASK_NAME='some_task'"]

# A value for each bound macro, different from every default; and how the resolved config shows it.
VALUES = {
    "MIXTURE_OR_TASK_NAME": "'my_mixture'", "MIXTURE_OR_TASK_MODULE": "'my_tasks'",
    "TASK_FEATURE_LENGTHS": "{'inputs': 24, 'targets': 40}", "TRAIN_STEPS": "77", "BATCH_SIZE": "6",
    "MODEL_DIR": "'/runs/a'", "MODEL": "@T5Config()", "USE_CACHED_TASKS": "True",
    "SHUFFLE_TRAIN_EXAMPLES": "False", "RANDOM_SEED": "17", "INITIAL_CHECKPOINT_PATH": "'/runs/base'",
    "DROPOUT_RATE": "0.25", "EVAL_PERIOD": "'1 epoch'", "EVAL_STEPS": "9", "Z_LOSS": "0.003",
    "LABEL_SMOOTHING": "0.1", "CHECKPOINT_PATH": "'/runs/b/checkpoints/40'", "EVAL_OUTPUT_DIR": "'/out/eval'",
    "INFER_OUTPUT_DIR": "'/out/infer'",
}
EXPECTED = {"MODEL": lambda value: getattr(value, "configurable", None) is not None
            and value.configurable.name == "T5Config"}


def load(files: list[str], flags: list[str], entry_point: str):
    gin_files, bindings, paths, rest = parsing.split_gin_flags([f"--gin_file={f}" for f in files] + flags)
    assert not rest
    return config_resolve.load_run(gin_files=gin_files, gin_bindings=bindings, gin_search_paths=paths,
                                   entry=entry_point)


def param(resolved, label: str):
    """The value the call of `label` ('call.param', as `config show` names it) receives."""
    call_label, name = label.rsplit(".", 1)
    for call, params in resolved.calls:
        if call.label == call_label:
            return next(p for p in params if p.name == name).value
    raise AssertionError(f"{call_label} is not called; calls: {[c.label for c, _ in resolved.calls]}")


def run_reading(label: str) -> tuple[list[str], list[str], str]:
    """(gin files, flags, entry point) of a t5x-style run whose config calls `label`."""
    if label.startswith(("evaluate.", "SeqioEval.")):
        return ["t5x/configs/runs/eval.gin"], ["--gin.MIXTURE_OR_TASK_NAME='some_task'"], "evaluate"
    if label.startswith("infer."):
        return ["t5x/configs/runs/infer.gin"], ["--gin.MIXTURE_OR_TASK_NAME='some_task'"], "infer"
    model = "models/t5_tiny.gin" if "T5Config" in label else "models/decoder_tiny.gin"
    run = "t5x/configs/runs/finetune.gin" if label.startswith("InitFrom.") else "t5x/configs/runs/pretrain.gin"
    return [model, run], TRAIN, "train"


def test_every_bound_macro_has_a_test_value():
    assert set(VALUES) == {name for name, macro in T5X_MACROS.items() if not macro.refused}


@pytest.mark.parametrize("name", [n for n, m in T5X_MACROS.items() if not m.refused])
def test_a_bound_t5x_macro_sets_its_parameters_and_is_not_warned_about(name):
    for label in T5X_MACROS[name].sets:
        files, flags, entry_point = run_reading(label)
        resolved = load(files, [*flags, f"--gin.{name}={VALUES[name]}"], entry_point)
        value = param(resolved, label)
        if name in EXPECTED:
            assert EXPECTED[name](value), (label, value)
        else:
            assert value == eval(VALUES[name]), (label, value)  # noqa: S307 - the test's own literals
        assert not [line for line in config_command.unused_warnings(resolved) if line.startswith(f"{name} ")]


def test_dropout_rate_set_before_the_model_file_is_kept_and_defaults_to_zero(tmp_path):
    run = tmp_path / "run.gin"
    run.write_text("DROPOUT_RATE = 0.3\n")
    resolved = load([str(run), "models/t5_tiny.gin", "runs/pretrain.gin"], TRAIN, "train")
    assert param(resolved, "MODEL/T5Config.dropout_rate") == 0.3
    default = load(["models/decoder_tiny.gin", "runs/pretrain.gin"], TRAIN, "train")
    assert param(default, "MODEL/DecoderConfig.dropout_rate") == 0.0
    assert default.macro("DROPOUT_RATE").binding.source.startswith("default (")


def test_a_bound_macro_a_run_does_not_read_says_what_it_sets():
    resolved = load(["t5x/configs/runs/eval.gin"], ["--gin.MIXTURE_OR_TASK_NAME='t'", "--gin.Z_LOSS=0.5"], "evaluate")
    [line] = config_command.unused_warnings(resolved)
    assert "t5x's Z_LOSS sets LossConfig.z_loss" in line and "this evaluate run does not" in line
    assert "no binding uses this macro" not in line


@pytest.mark.parametrize("name", [n for n, m in T5X_MACROS.items() if m.refused])
def test_a_refused_t5x_macro_fails_in_one_line_naming_the_equivalent(name):
    with pytest.raises(parsing.ConfigError) as e:
        load(["runs/quickstart.gin"], [f"--gin.{name}=123"], "train")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{name} (--gin.{name}=123) is t5x's")
    assert (T5X_MACROS[name].instead or "drop it") in message


def test_a_refused_macro_set_to_what_is_done_here_anyway_is_accepted_silently():
    resolved = load(["runs/quickstart.gin"], ["--gin.USE_HARDWARE_RNG=False", "--gin.TRAIN_STEPS_RELATIVE=None"],
                    "train")
    assert config_command.unused_warnings(resolved) == []
    with pytest.raises(parsing.ConfigError, match="TRAIN_STEPS_RELATIVE"):
        load(["runs/quickstart.gin"], ["--gin.TRAIN_STEPS_RELATIVE=100"], "train")


def test_a_macro_named_like_a_refused_one_that_the_users_bindings_read_is_theirs(tmp_path):
    run = tmp_path / "run.gin"
    run.write_text("include 'runs/quickstart.gin'\nVOCABULARY = 7\ntrain.log_period = %VOCABULARY\n")
    assert param(load([str(run)], [], "train"), "train.log_period") == 7


def test_a_refusal_through_the_cli_is_one_error_line_and_exit_2():
    result = run_cli_in_process("config", "show", "--gin_file=runs/quickstart.gin", "--gin.NUM_MODEL_PARTITIONS=2")
    assert_bad_input(result, "--gin_file=mesh/fsdp_tensor.gin")


def test_docs_from_t5x_lists_every_t5x_macro_as_the_table_says():
    doc = (ROOT / "docs" / "from_t5x.md").read_text()
    missing = [row for row in t5x_macros.doc_rows() if row not in doc]
    assert not missing, "docs/from_t5x.md: replace its t5x macro rows with\n" + "\n".join(t5x_macros.doc_rows())


# ------------------------------------------------------------------------------ USE_CACHED_TASKS


@pytest.fixture
def cacheable_task(tmp_path):
    """A seqio task that could be cached (it has a CacheDatasetPlaceholder) but is not; removed afterwards."""
    seqio = pytest.importorskip("seqio")

    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(8)))
    name = "t5x_macros_test_uncached"
    seqio.TaskRegistry.add(
        name, source=seqio.TextLineDataSource({"train": str(lines), "validation": str(lines)}),
        preprocessors=[lambda ds: ds.map(lambda line: {"targets": line}), seqio.preprocessors.tokenize,
                       seqio.CacheDatasetPlaceholder(), seqio.preprocessors.append_eos],
        output_features={"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)})
    cache_dirs = list(seqio.get_global_cache_dirs())
    try:
        yield name
    finally:
        seqio.TaskRegistry.remove(name)
        seqio.set_global_cache_dirs(cache_dirs)


def test_use_cached_tasks_on_an_uncached_task_names_the_cache_command(cacheable_task, tmp_path):
    model_dir = tmp_path / "run"
    result = run_cli_in_process("train", "--gin_file=models/decoder_tiny.gin", "--gin_file=t5x/configs/runs/pretrain.gin",
                                f"--gin.MIXTURE_OR_TASK_NAME='{cacheable_task}'", f"--gin.MODEL_DIR='{model_dir}'",
                                "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=8", "--gin.USE_CACHED_TASKS=True",
                                "--gin.DecoderConfig.vocab_size=384")
    assert_bad_input(result, f"t5x-lite cache --tasks={cacheable_task} --output_cache_dir=DIR",
                     "--seqio_additional_cache_dirs=DIR", "--gin.USE_CACHED_TASKS=False")
    assert not model_dir.exists()


def test_seqio_additional_cache_dirs_names_where_a_cache_is_found(cacheable_task, tmp_path):
    import seqio

    from t5x_lite.data import task_access

    (tmp_path / "cache" / seqio.utils.get_task_dir_from_name(cacheable_task)).mkdir(parents=True)
    (tmp_path / "cache" / seqio.utils.get_task_dir_from_name(cacheable_task) / "COMPLETED").touch()
    dirs, rest = entry._cache_dirs(["--other", "--seqio_additional_cache_dirs", str(tmp_path / "cache")])
    assert (dirs, rest) == ([str(tmp_path / "cache")], ["--other"])
    task_access.add_cache_dirs(dirs)
    task_access.check_cached(seqio.get_mixture_or_task(cacheable_task))  # found: no error
    assert seqio.get_mixture_or_task(cacheable_task).cache_dir == str(tmp_path / "cache" / cacheable_task)
    with pytest.raises(parsing.ConfigError, match="needs a value"):
        entry._cache_dirs(["--seqio_additional_cache_dirs="])


def test_the_t5x_run_files_read_no_refused_macro():
    gin_dir = parsing.builtin_gin_dir()
    text = "\n".join(p.read_text() for p in Path(gin_dir).rglob("*.gin"))
    assert not [name for name, macro in T5X_MACROS.items() if macro.refused and f"%{name}" in text]
