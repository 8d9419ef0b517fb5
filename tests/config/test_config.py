"""Gin flag parsing and file lookup."""

from __future__ import annotations

import os

import gin
import pytest

from t5x_lite.config import parsing


def test_split_gin_flags_t5x_style():
    files, bindings, paths, rest = parsing.split_gin_flags(
        ["--gin_file=a.gin", "--gin_file", "b.gin", "--gin.TRAIN_STEPS=100", "--gin.MODEL_DIR='/tmp/r'",
         "--gin_search_paths=x,y", "--other"])
    assert files == ["a.gin", "b.gin"]
    assert bindings == ["TRAIN_STEPS = 100", "MODEL_DIR = '/tmp/r'"]
    assert paths == ["x", "y"]
    assert rest == ["--other"]


def test_bindings_override_files_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "extra.gin").write_text("DecoderConfig.num_layers = 3\n")
    parsing.parse(gin_files=["runs/quickstart.gin", "extra.gin"], gin_bindings=["DecoderConfig.emb_dim = 96"])
    assert gin.query_parameter("DecoderConfig.num_layers") == 3
    assert gin.query_parameter("DecoderConfig.emb_dim") == 96


def test_folders_named_like_gin_dirs_in_the_working_directory_do_not_break_lookup(tmp_path, monkeypatch):
    """A model directory `runs/` beside the user must not shadow gin's `runs/quickstart.gin`."""
    from gin import resource_reader

    for name in ("runs", "models", "mesh"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the working directory first
    # gin registers its package-path reader on import; put it back in case an earlier parse removed it.
    readers = [(open, os.path.isfile),
               (resource_reader.system_path_reader, resource_reader.system_path_file_exists)]
    monkeypatch.setattr(gin.config, "_FILE_READERS", readers)
    parsing.parse(gin_files=["runs/quickstart.gin"])
    assert gin.query_parameter("train.checkpoint_period") > 0


def test_missing_file_names_the_search_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(parsing.ConfigError, match="searched in"):
        parsing.parse(gin_files=["runs/nope.gin"], gin_search_paths=[str(tmp_path)])
