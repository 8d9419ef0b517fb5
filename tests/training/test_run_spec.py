"""training/run_spec.py: the one description of a run and the one check of its layout (train,
estimate and launch all call it; tests/estimate/ checks the estimate CLI's messages end to end)."""

from __future__ import annotations

import pytest

from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import ConfigValueError, RunConfigError, UserError
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.models.encoder_decoder import T5Config
from t5x_lite.training import run_spec
from t5x_lite.training.run_spec import RunSpec

MODEL = DecoderConfig(vocab_size=512, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=2, max_len=64)


def spec(**overrides) -> RunSpec:
    values = dict(model=MODEL, train_data=DataConfig("t", sequence_length=64, batch_size=8), train_steps=10)
    return RunSpec(**{**values, **overrides})


def test_a_run_that_fits_passes():
    run_spec.check_layout(spec(), batch_shards=8, num_processes=2)
    run_spec.check_layout(spec(microbatches=2), batch_shards=4)


@pytest.mark.parametrize("overrides, layout, message", [
    (dict(train_steps=None), {}, "Set TRAIN_STEPS or train.num_epochs"),
    (dict(train_data=DataConfig("t", sequence_length=128, batch_size=8)), {},
     "train sequence_length=128 does not fit the model's max_len=64"),
    (dict(eval_data=DataConfig("t", split="validation", sequence_length=65, batch_size=8)), {},
     "validation sequence_length=65 does not fit"),
    ({}, dict(num_processes=3), "batch_size=8 must divide over 3 processes"),
    ({}, dict(batch_shards=16), "train batch_size=8 must be a multiple of the 16 batch shards"),
    (dict(microbatches=3), {}, "must be a multiple of microbatches x batch shards = 3 x 1"),
])
def test_each_misfit_is_one_run_config_error_naming_it(overrides, layout, message):
    with pytest.raises(RunConfigError, match=message) as e:
        run_spec.check_layout(spec(**overrides), **{"batch_shards": 1, **layout})
    assert isinstance(e.value, ConfigValueError) and isinstance(e.value, UserError)


def test_an_encoder_decoder_has_no_max_len_to_outgrow():
    t5 = T5Config(vocab_size=512, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                  num_decoder_layers=2)
    run = spec(model=t5, train_data=DataConfig("t", sequence_length=4096, inputs_length=512, batch_size=8))
    run_spec.check_layout(run, batch_shards=1)
    assert run.train_data.feature_converter == "enc_dec"  # the family's converter is filled in


@pytest.mark.parametrize("vocab, model_vocab, ok", [
    (500, 500, True), (500, 512, True), (500, 499, False), (500, 513, False),
    # Qwen2: 151,665 tokenizer ids, a 151,936-row embedding (within 1%); not 2% more.
    (151_665, 151_936, True), (151_665, 151_665 + 3_033, False)])
def test_the_model_vocabulary_holds_the_tasks_padded_to_a_multiple_of_128_or_by_1_percent(vocab, model_vocab, ok):
    model = DecoderConfig(vocab_size=model_vocab, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=2)
    if ok:
        run_spec.check_vocabulary(model, vocab)
    else:
        with pytest.raises(RunConfigError, match=f"vocabulary has {vocab} entries.*vocab_size={vocab} \\(or up to"):
            run_spec.check_vocabulary(model, vocab)


def test_checkpoint_metadata_reads_back_equal_through_json():
    import json

    metadata = run_spec.checkpoint_metadata(spec(), vocab_size=500)
    assert json.loads(json.dumps(metadata)) == metadata
    assert metadata["mesh_axes"] == [["data", -1], ["fsdp", 1], ["tensor", 1]]
    assert (metadata["family"], metadata["vocab_size"], metadata["sequence_length"]) == ("decoder_only", 500, 64)
