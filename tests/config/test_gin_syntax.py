"""Gin syntax errors that gin reports without a file, or not as a ValueError: each a ConfigError
naming the file and line (or the --gin binding) and what to fix."""

from __future__ import annotations

import pytest

from t5x_lite.config import parsing


@pytest.mark.parametrize("text, message", [
    ("TRAIN_STEPS = 3\nMESH_AXES = [('data', 1),\n  ('fsdp', 1)\n", "line 2: '[' opened here is never closed; "
     "the file ends inside it"),
    ("TRAIN_STEPS = (3\n", "line 1: '(' opened here is never closed"),
    ("SEED = 1\nMODEL_DIR = '''/tmp/x\n", "line 2: a string opened here is never closed"),
    ("TRAIN_STEPS = 3 \\\n", "line 1: the statement continues past the end (a trailing backslash?)"),
    ("SEED = 1\nTRAIN_STEPS = ten\n", "Cannot read the value 'ten' (bad.gin, line 2): a string needs quotes"),
])
def test_a_syntax_error_names_the_file_and_line(tmp_path, text, message):
    bad = tmp_path / "bad.gin"
    bad.write_text(text)
    with pytest.raises(parsing.ConfigError) as e:
        parsing.parse(gin_files=["runs/quickstart.gin", str(bad)])
    assert message in str(e.value), str(e.value)
    assert "bad.gin" in str(e.value)


def test_an_error_in_an_included_file_names_that_file(tmp_path):
    (tmp_path / "inner.gin").write_text("SEED = [1,\n")
    (tmp_path / "outer.gin").write_text(f"include '{tmp_path / 'inner.gin'}'\n")
    with pytest.raises(parsing.ConfigError, match=r"inner.gin, line 1: '\[' opened here is never closed"):
        parsing.parse(gin_files=[str(tmp_path / "outer.gin")])


def test_a_file_that_includes_itself_is_refused(tmp_path):
    (tmp_path / "a.gin").write_text(f"include '{tmp_path / 'b.gin'}'\n")
    (tmp_path / "b.gin").write_text(f"include '{tmp_path / 'a.gin'}'\n")
    with pytest.raises(parsing.ConfigError, match=r"a.gin includes itself: .*a.gin -> .*b.gin -> .*a.gin"):
        parsing.parse(gin_files=[str(tmp_path / "a.gin")])


def test_an_import_of_a_missing_module_and_a_binary_file_are_config_errors(tmp_path):
    (tmp_path / "imports.gin").write_text("import no_such_module_for_t5x_lite\n")
    with pytest.raises(parsing.ConfigError, match=r"No module named 'no_such_module_for_t5x_lite'(.|\n)*imports.gin"):
        parsing.parse(gin_files=[str(tmp_path / "imports.gin")])
    (tmp_path / "binary.gin").write_bytes(b"SEED = 1\n\xff\xfe = 2\n")
    with pytest.raises(parsing.ConfigError, match=r"binary.gin is not a text file \(UTF-8\)"):
        parsing.parse(gin_files=[str(tmp_path / "binary.gin")])


@pytest.mark.parametrize("binding, message", [
    ("TRAIN_STEPS = (3", "Cannot parse the binding --gin.TRAIN_STEPS=(3: '(' opened here is never closed"),
    ("TRAIN_STEPS = ten", "Cannot read the value 'ten' (in --gin.TRAIN_STEPS=ten): a string needs quotes"),
    ("MODEL_DIR = '/tmp/x", "Unable to parse value. (in --gin.MODEL_DIR='/tmp/x)"),
])
def test_a_bad_binding_is_named(binding, message):
    with pytest.raises(parsing.ConfigError) as e:
        parsing.parse(gin_files=["runs/quickstart.gin"], gin_bindings=["SEED = 1", binding])
    assert message in str(e.value), str(e.value)
