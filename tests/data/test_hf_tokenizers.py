"""Hugging Face tokenizers as vocabularies (and seqio's), `prepare --tokenizer`, and a real token 0.

Four tokenizer families are built here (nothing downloaded): GPT-2's byte-level BPE, Qwen2's
(NFC, a split regex, byte-level BPE) and Gemma's (spaces as "▁", byte-fallback BPE) as
tokenizer.json files, and LLaMA's SentencePiece BPE with byte fallback (unk 0, bos 1, eos 2) as a
tokenizer.model. Each gives the ids `tokenizers`/transformers give, round-trips, and its
TensorFlow path equals its Python path. In GPT-2's vocabulary id 0 is "!": a document holding it
gets loss weight on it, and scoring counts it.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

import sentencepiece  # noqa: E402
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from t5x_lite.data import task_access, task_factories  # noqa
from t5x_lite.data.preparation import prepare  # noqa: E402
from t5x_lite.data.preparation.corpus import PrepareError  # noqa: E402
from t5x_lite.data.streaming import input_pipeline  # noqa: E402
from t5x_lite.data.vocab import hf_vocabulary, seqio_vocabularies, tokenizer_files  # noqa: E402
from t5x_lite.data.vocab.tokenizer_files import SpecialIds, TokenizerError, TokenizerSource  # noqa: E402
from t5x_lite.errors import TaskDataError  # noqa: E402
from t5x_lite.tf_setup import import_tensorflow  # noqa: E402

tf = import_tensorflow()

import seqio  # noqa: E402

# English, accented Latin, Cyrillic, CJK, emoji, and code with tabs and newlines; "ß", "Ж", "漢"
# and the crab are not in the training corpus (byte fallback / byte-level pieces).
TEXT = ("The quick brown fox! Ça va? Élève naïve — Grüße, façade.\nПривет, мир! Жук. 你好，世界。こんにちは 漢字 "
        "🙂🦀\ndef f(x):\n\treturn x  + 1  # done!\n\n\tif x:\n\t\tpass\n  trailing   spaces ")
CORPUS = ["The quick brown fox jumps over the lazy dog! " * 3, "Ça va? Élève naïve — façade, très bien.",
          "Привет, мир! Съешь же ещё этих мягких французских булок.", "你好，世界。机器学习 深度学习 こんにちは",
          "def f(x):\n\treturn x + 1\n\nfor i in range(10):\n\tprint(i)  # loop\n", "Emoji: 🙂🚀 ok!"] * 8
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
VOCAB = 400
JSON_KINDS = ("gpt2", "qwen2", "gemma")


def _byte_level(tokenizer, specials: list[str]):
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.add_special_tokens(specials)  # after the learned pieces, as in GPT-2 and Qwen2: id 0 is "!"
    return tokenizer


def gpt2_tokenizer():
    """GPT-2: byte-level pre-tokenizer (its regex), byte-level BPE, <|endoftext|> last."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return _byte_level(tokenizer, ["<|endoftext|>"])


def qwen2_tokenizer():
    """Qwen2: NFC, a split on its regex, then byte-level BPE; <|endoftext|> and the chat tokens after."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return _byte_level(tokenizer, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])


def gemma_tokenizer():
    """Gemma: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, 256 byte pieces, then BPE over spaces as "▁"."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=VOCAB + 256, special_tokens=specials
                                                              + byte_pieces, show_progress=False))
    spec = json.loads(tokenizer.to_str())  # the byte pieces are vocabulary entries, not added tokens
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in specials]
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def llama_model() -> bytes:
    """LLaMA's SentencePiece settings: BPE, byte fallback, digits split, unk 0 / bos 1 / eos 2, no pad."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=VOCAB,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True, split_digits=True, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, num_threads=1, minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    """One Hugging Face style folder per family: its tokenizer file and tokenizer_config.json."""
    base = tmp_path_factory.mktemp("tokenizers")
    configs = {"gpt2": None,  # a bare tokenizer.json: EOS from its well-known special token
               "qwen2": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None},
               "gemma": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}}
    built = {"gpt2": gpt2_tokenizer, "qwen2": qwen2_tokenizer, "gemma": gemma_tokenizer}
    out = {}
    for kind in JSON_KINDS:
        (base / kind).mkdir()
        built[kind]().save(str(base / kind / "tokenizer.json"))
        if configs[kind]:
            (base / kind / "tokenizer_config.json").write_text(json.dumps(configs[kind]))
        out[kind] = base / kind
    (base / "llama").mkdir()
    (base / "llama" / "tokenizer.model").write_bytes(llama_model())
    out["llama"] = base / "llama"
    return out


def _transformers_ids(kind: str, folder) -> list[int]:
    if kind == "llama":
        return transformers.LlamaTokenizer.from_pretrained(str(folder)).encode(TEXT, add_special_tokens=False)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    return fast(TEXT, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------ vocabularies


@pytest.mark.parametrize("kind", [*JSON_KINDS, "llama"])
def test_ids_are_the_tokenizers_own_and_round_trip_in_python_and_tensorflow(kind, folders):
    vocabulary = hf_vocabulary.load_path(str(folders[kind]))
    ids = list(vocabulary.encode(TEXT))
    if kind == "llama":
        own = sentencepiece.SentencePieceProcessor(model_file=str(folders[kind] / "tokenizer.model")).encode(TEXT)
        assert {"<0xC3>", "<0x9F>"} <= {vocabulary.tokenizer.id_to_piece(i) for i in ids}  # "ß" fell back to bytes
    else:
        own = tokenizers.Tokenizer.from_file(str(folders[kind] / "tokenizer.json")).encode(
            TEXT, add_special_tokens=False).ids
    assert ids == own == _transformers_ids(kind, folders[kind])
    assert vocabulary.decode(ids) == TEXT
    assert vocabulary.decode([*ids, vocabulary.eos_id, 7, 8]) == TEXT  # up to the first EOS

    as_seqio = seqio_vocabularies.as_seqio(vocabulary)
    assert as_seqio.native is vocabulary and as_seqio.encode(TEXT) == ids
    assert as_seqio.encode_tf(tf.constant(TEXT)).numpy().tolist() == ids
    assert as_seqio.decode_tf(tf.constant([*ids, vocabulary.eos_id, 7, 8])).numpy().decode() == TEXT
    assert [t.decode() for t in as_seqio.decode_tf(tf.constant([ids[:5], ids[-5:]])).numpy()] == \
        [vocabulary.decode(ids[:5]), vocabulary.decode(ids[-5:])]
    tokenized = seqio.preprocessors.tokenize(tf.data.Dataset.from_tensors({"targets": TEXT}),
                                             output_features={"targets": seqio.Feature(as_seqio)})
    assert next(tokenized.as_numpy_iterator())["targets"].tolist() == ids  # inside tf.data, as tasks tokenize


@pytest.mark.parametrize("kind", [*JSON_KINDS, "llama"])
def test_python_and_tensorflow_decode_alike_past_the_vocabulary_and_eos(kind, folders):
    """ids past the vocabulary decode as UNK (when there is one), nothing after the first EOS, [] as ''."""
    vocabulary = hf_vocabulary.load_path(str(folders[kind]))
    as_seqio = seqio_vocabularies.as_seqio(vocabulary)
    ids, eos, size = vocabulary.encode(TEXT)[:12], vocabulary.eos_id, vocabulary.vocab_size
    for id_list in ([], [eos], ids, [*ids[:4], eos, *ids[4:]], [*ids[:3], size, size + 50, *ids[3:6]],
                    [eos, eos, 5], [size + 1, eos, size + 2]):
        python = vocabulary.decode(id_list)
        assert python == as_seqio.decode(id_list) == as_seqio.decode_tf(tf.constant(id_list, tf.int32)).numpy().decode()
        assert python == vocabulary.decode(np.asarray(id_list, np.int32))
    assert vocabulary.decode([*ids[:4], eos, *ids[4:]]) == vocabulary.decode(ids[:4])
    if vocabulary.unk_id is not None:  # Gemma's <unk>, LLaMA's: what an id past the vocabulary decodes to
        assert vocabulary.decode([size + 7]) == vocabulary.decode([vocabulary.unk_id])


@pytest.mark.parametrize("kind, ids, start, zero_is_token", [
    ("gpt2", SpecialIds(eos=VOCAB), VOCAB, True),  # "!" is id 0
    ("qwen2", SpecialIds(eos=VOCAB, pad=VOCAB), VOCAB, True),
    ("gemma", SpecialIds(bos=2, eos=1, pad=0, unk=3), 2, False),
    ("llama", SpecialIds(bos=1, eos=2, unk=0), 1, True),  # <unk> is id 0, and there is no padding
])
def test_special_ids_come_from_the_model_folder(kind, ids, start, zero_is_token, folders):
    vocabulary = hf_vocabulary.load_path(str(folders[kind]))
    assert vocabulary.ids == ids
    assert (vocabulary.eos_id, vocabulary.bos_id, vocabulary.unk_id) == (ids.eos, ids.bos, ids.unk)
    assert tokenizer_files.decoder_start_id(vocabulary) == start
    assert tokenizer_files.zero_is_token(vocabulary) is zero_is_token
    if kind == "llama":
        assert vocabulary.vocab_size == VOCAB
    else:  # the largest id + 1, added tokens included
        own = tokenizers.Tokenizer.from_file(str(folders[kind] / "tokenizer.json"))
        assert vocabulary.vocab_size == own.get_vocab_size(with_added_tokens=True) > VOCAB


def test_the_models_config_json_comes_before_the_tokenizers_files(folders, tmp_path):
    folder = tmp_path / "qwen2"
    shutil.copytree(folders["qwen2"], folder)
    (folder / "config.json").write_text(json.dumps({"bos_token_id": VOCAB + 1, "eos_token_id": [VOCAB + 2, VOCAB]}))
    vocabulary = hf_vocabulary.load_path(str(folder))
    assert vocabulary.ids == SpecialIds(bos=VOCAB + 1, eos=VOCAB + 2, pad=VOCAB)  # generation's first EOS
    assert tokenizer_files.decoder_start_id(vocabulary) == VOCAB + 1


def test_seqio_vocabularies_keep_their_start_and_padding():
    assert tokenizer_files.decoder_start_id(seqio.ByteVocabulary()) == 0
    assert tokenizer_files.zero_is_token(seqio.ByteVocabulary()) is False


def test_hugging_face_vocabularies_pickle_without_their_loaded_tokenizer(folders):
    import pickle

    for kind in ("gpt2", "llama"):
        vocabulary = hf_vocabulary.load_path(str(folders[kind]))
        ids = vocabulary.encode(TEXT)
        for each in (vocabulary, seqio_vocabularies.as_seqio(vocabulary)):
            copy = pickle.loads(pickle.dumps(each))  # a Beam worker, a gin deep copy
            assert copy == each and hash(copy) == hash(each) and copy.encode(TEXT) == ids


def test_a_model_directory_reads_its_own_tokenizer(folders, tmp_path):
    """MODEL_DIR/hf/'s tokenizer is the model's unless the run's vocabulary is another SentencePiece model."""
    gpt2, llama = tmp_path / "gpt2_run", tmp_path / "llama_run"
    shutil.copytree(folders["gpt2"], gpt2 / "hf")
    assert tokenizer_files.model_dir_tokenizer(str(gpt2)) == TokenizerSource(str(gpt2 / "hf"), "tokenizer.json")
    (gpt2 / "vocab").mkdir()
    (gpt2 / "vocab" / "spm.model").write_bytes(llama_model())  # the run trained on a vocabulary of its own
    assert tokenizer_files.model_dir_tokenizer(str(gpt2)) is None
    with pytest.raises(TokenizerError, match="pass --vocab_model="):
        tokenizer_files.find(str(gpt2))

    shutil.copytree(folders["llama"], llama / "hf")
    (llama / "vocab").mkdir()
    shutil.copy(folders["llama"] / "tokenizer.model", llama / "vocab" / "spm.model")  # as from-hf writes it
    assert tokenizer_files.model_dir_tokenizer(str(llama)) == TokenizerSource(str(llama / "hf"), "tokenizer.model")
    assert hf_vocabulary.model_dir_vocabulary(str(llama)).decoder_start_id == 1


# ---------------------------------------------------------------------------------- a real token 0


def _text_task(name: str, texts: list[str], tokenizer_json, folder) -> str:
    """A `text_task` over a jsonl file of `texts`, tokenized (inside tf.data) by the tokenizer.json."""
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return task_factories.text_task(name=name, splits={"train": str(path)}, vocabulary=str(tokenizer_json))


@pytest.mark.parametrize("pack", [True, False])
def test_a_document_holding_token_0_gets_loss_weight_on_it(pack, folders):
    vocabulary = hf_vocabulary.load_path(str(folders["gpt2"]))
    assert vocabulary.encode("!") == [0]
    texts = ["Hi! ok", "Stop!", "!! wow !", "The dog!"]
    documents = [[*vocabulary.encode(t), vocabulary.eos_id] for t in texts]
    assert all(0 in d for d in documents)
    task = _text_task("hf_token_zero", texts, folders["gpt2"] / "tokenizer.json", folders["gpt2"].parent)
    assert task_access.get_task(task).output_features["targets"].vocabulary == seqio_vocabularies.as_seqio(vocabulary)
    config = task_access.DataConfig(task, sequence_length=16, batch_size=4, shuffle=False, pack=pack)
    rows = list(input_pipeline.epoch_rows(config, epoch=0, shard_index=0, num_shards=1).as_numpy_iterator())

    scored = [row["decoder_target_tokens"][row["decoder_loss_weights"] > 0].tolist() for row in rows]
    assert sum(scored, []) == sum(documents, [])  # every token, "!" (0) included, weighted once, in order
    for row in rows:
        targets, inputs, weights = row["decoder_target_tokens"], row["decoder_input_tokens"], row["decoder_loss_weights"]
        real = weights > 0
        assert (targets[~real] == 0).all() and (inputs[~real] == 0).all()
        segments = row["decoder_segment_ids"] if pack else real.astype(np.int32)
        assert (segments[real] > 0).all() and (segments[~real] == 0).all()
        starts = real & (row["decoder_positions"] == 0) if pack else real & (np.arange(len(real)) == 0)
        # Each document starts from the decoder start (GPT-2: <|endoftext|>), then reads its own tokens.
        assert (inputs[starts] == VOCAB).all() and starts.sum() >= 1
        follows = real & ~starts
        assert (inputs[follows] == np.roll(targets, 1)[follows]).all()

    # seqio's own converter takes the "!" for padding: the pitfall the converter above avoids.
    dataset = tf.data.Dataset.from_tensor_slices({"targets": tf.ragged.constant(documents)})
    dataset = dataset.map(lambda x: {"targets": x["targets"]})
    plain = next(seqio.LMFeatureConverter(pack=False)(dataset, {"targets": 16}).as_numpy_iterator())
    assert plain["decoder_loss_weights"][plain["decoder_target_tokens"] == 0][:2].tolist() == [0, 0]


def test_a_prefix_lm_row_keeps_token_0_in_its_prefix_and_its_targets(folders):
    from t5x_lite.data.streaming import feature_converters

    vocabulary = hf_vocabulary.load_path(str(folders["gpt2"]))
    converter = feature_converters.feature_converter("prefix_lm", pack=False, vocabulary=vocabulary)
    example = {"inputs": [5, 0, 7], "targets": [0, 9, VOCAB]}
    dataset = tf.data.Dataset.from_tensors({k: tf.constant(v, tf.int32) for k, v in example.items()})
    row = next(converter(dataset, {"inputs": 4, "targets": 4}).as_numpy_iterator())
    assert row["decoder_target_tokens"].tolist() == [5, 0, 7, 0, 9, VOCAB, 0, 0]
    assert row["decoder_input_tokens"].tolist() == [VOCAB, 5, 0, 7, 0, 9, 0, 0]
    assert row["decoder_loss_weights"].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    assert row["decoder_causal_attention"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def test_an_encoder_decoder_refuses_a_vocabulary_whose_token_0_is_real(folders):
    from t5x_lite.data.streaming import feature_converters

    vocabulary = hf_vocabulary.load_path(str(folders["gpt2"]))
    with pytest.raises(TaskDataError, match="takes token 0 for padding"):
        feature_converters.feature_converter("enc_dec", pack=True, vocabulary=vocabulary)
    gemma = hf_vocabulary.load_path(str(folders["gemma"]))  # <pad> is 0: seqio's converter as it is
    assert type(feature_converters.feature_converter("enc_dec", pack=True, vocabulary=gemma)) is \
        seqio.EncDecFeatureConverter


def test_scoring_counts_a_continuation_token_0_after_the_vocabularys_bos():
    import jax
    import jax.numpy as jnp

    from t5x_lite.inference import scoring
    from t5x_lite.models import DecoderConfig

    config = DecoderConfig(vocab_size=16, emb_dim=32, num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64,
                           num_layers=2, max_len=16, dtype="float32")
    params = config.make_module().init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    context, continuation, bos = [3, 4], [0, 5, 0], 7
    [(logprob, count, _)] = scoring.continuation_logprobs(model=config, params=params, batch_size=2,
                                                          requests=[(context, continuation)], bos_id=bos)
    tokens = jnp.asarray([[bos, *context, *continuation]])
    logprobs = jax.nn.log_softmax(config.make_module().apply({"params": params}, tokens[:, :-1])[0])
    expected = [float(logprobs[len(context) + i, t]) for i, t in enumerate(continuation)]
    assert count == 3
    np.testing.assert_allclose(logprob, sum(expected), rtol=1e-5)
    assert abs(expected[0]) > 0.1 and abs(logprob - sum(expected[1:])) > 0.1  # the 0s count


def test_decoding_may_generate_token_0_when_it_is_real():
    import jax.numpy as jnp

    from t5x_lite.models import generation

    logits = jnp.asarray([[5.0, 1.0, 0.0]])
    settings = dict(temperature=0.0, top_k=0, top_p=1.0)
    assert int(generation.next_token(logits, None, **settings)[0]) == 1  # seqio's padding is never chosen
    assert int(generation.next_token(logits, None, **settings, zero_is_token=True)[0]) == 0
    assert generation.until_eos([4, 0, 3, 9, 5], eos_id=9) == [4]
    assert generation.until_eos([4, 0, 3, 9, 5], eos_id=9, zero_is_token=True) == [4, 0, 3]
    assert generation.until_eos([4, 0, generation.STOPPED, 0], eos_id=9, zero_is_token=True) == [4, 0]


# --------------------------------------------------------------------------------------- prepare


def _corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, text in enumerate([TEXT, *CORPUS[:6], "Hello! World!", "Wait... what?!", "Ok!\n\tdone"]):
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return folder


def _records(data_dir, split: str) -> list[list[int]]:
    files = sorted(str(p) for p in data_dir.glob(f"{split}-*.tfrecord"))
    spec = {"targets": tf.io.VarLenFeature(tf.int64)}
    return [tf.sparse.to_dense(tf.io.parse_single_example(r, spec)["targets"]).numpy().tolist()
            for r in tf.data.TFRecordDataset(files)]


@pytest.mark.parametrize("kind, path", [("gpt2", "tokenizer.json"), ("llama", "")])
def test_prepare_with_a_tokenizer_records_and_copies_it_for_the_task(kind, path, folders, tmp_path):
    corpus, out = _corpus(tmp_path), tmp_path / "data"
    given = str(folders[kind] / path) if path else str(folders[kind])
    result = prepare.prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=given, num_shards=1,
                             validation_fraction=0.3, seed=2, num_workers=1, log=lambda _: None)
    vocabulary = hf_vocabulary.load_path(given)
    name = "tokenizer.json" if kind == "gpt2" else "tokenizer.model"
    assert result["vocabulary"] == f"tokenizer/{name}" and (out / "tokenizer" / name).is_file()
    assert result["vocab_size"] == vocabulary.vocab_size
    assert result["tokenizer"] == {"file": f"tokenizer/{name}", "kind": "tokenizer.json" if kind == "gpt2" else
                                   "sentencepiece", "source": given, **vocabulary.ids.to_json(),
                                   "decoder_start_id": vocabulary.decoder_start_id, "zero_is_token": True}
    assert not (out / "spm.model").exists()
    texts = sorted(p.read_text(encoding="utf-8") for p in corpus.iterdir())
    records = _records(out, "train") + _records(out, "validation")
    assert sorted(vocabulary.decode(r) for r in records) == texts  # the tokenizer's ids, without BOS or EOS
    assert sorted(map(tuple, records)) == sorted(tuple(vocabulary.encode(t)) for t in texts)

    task = task_factories.lm_task(name=f"hf_prepared_{kind}", data_dir=str(out))
    task_vocabulary = task_access.get_task(task).output_features["targets"].vocabulary
    assert task_vocabulary.ids == vocabulary.ids and task_vocabulary.encode(TEXT) == vocabulary.encode(TEXT)
    assert str(out / "tokenizer") in task_vocabulary.files[0]


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.json", "does not exist"),
    (lambda d: (d / "notes.txt").write_text("x") and d / "notes.txt", "neither a tokenizer.json nor"),
    (lambda d: (d / "tokenizer.json").write_text("{not json") and d / "tokenizer.json", "not a tokenizer.json"),
    (lambda d: (d / "tokenizer.model").write_bytes(b"\x00junk") and d / "tokenizer.model", "not a SentencePiece"),
    (lambda d: d, "holds no tokenizer"),
])
def test_a_bad_tokenizer_path_is_one_clear_error_and_nothing_is_written(make, message, folders, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(TokenizerError, match=message):
        prepare.prepare(inputs=[str(_corpus(tmp_path))], out_dir=str(tmp_path / "out"), tokenizer=str(make(bad)),
                        num_workers=1, log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_larger_than_its_model_or_with_another_vocabulary_is_refused(folders, tmp_path, capsys):
    folder = tmp_path / "gpt2"
    shutil.copytree(folders["gpt2"], folder)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 300, "eos_token_id": VOCAB}))
    corpus, out = _corpus(tmp_path), tmp_path / "out"
    with pytest.raises(PrepareError, match=r"has 401 ids but the model .* has vocab_size=300: ids 300..400"):
        prepare.prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=str(folder), log=lambda _: None)
    with pytest.raises(PrepareError, match="drop --vocab_model"):
        prepare.prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=str(folder), vocab_model="x.model")
    assert prepare.main([f"--input={corpus}", f"--out={out}", f"--tokenizer={folder}"]) == 2
    assert "error: The tokenizer" in capsys.readouterr().err
    assert not out.exists()


def test_prepare_to_s3_uploads_the_tokenizer_and_the_task_reads_it_there(folders, s3_server, tmp_path):
    from t5x_lite import storage
    from tests.conftest import S3_BUCKET

    out = f"s3://{S3_BUCKET}/hf_tokenizer"
    options = dict(inputs=[str(_corpus(tmp_path))], out_dir=out, num_shards=1, validation_fraction=0.3, seed=2,
                   num_workers=1, log=lambda _: None)
    prepare.prepare(tokenizer=str(folders["gpt2"]), **options)
    prepare.prepare(tokenizer=str(folders["llama"]), overwrite=True, **options)  # replaces the first one whole
    assert storage.listdir(f"{out}/tokenizer") == ["tokenizer.model"]
    vocabulary = task_access.get_task(task_factories.lm_task(name="hf_s3", data_dir=out)).output_features[
        "targets"].vocabulary
    assert vocabulary.ids == SpecialIds(bos=1, eos=2, unk=0) and vocabulary.decode(vocabulary.encode(TEXT)) == TEXT


# ------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_a_converted_gpt2_prepares_fine_tunes_samples_and_goes_back_with_its_tokenizer(folders, tmp_path, capsys):
    """from-hf of a tiny GPT-2 folder with its tokenizer.json -> prepare --tokenizer=the conversion -> train
    a few steps with init_from (the CLI) -> sample on the fine-tuned MODEL_DIR -> to-hf writes the tokenizer."""
    from t5x_lite.checkpoints import restored_model
    from t5x_lite.hf import convert
    from t5x_lite.inference import sample
    from tests.cli_helpers import run_cli

    hf = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=VOCAB + 1, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                     bos_token_id=VOCAB, eos_token_id=VOCAB)
    transformers.GPT2LMHeadModel(config).save_pretrained(hf)
    shutil.copy(folders["gpt2"] / "tokenizer.json", hf / "tokenizer.json")
    converted, data, tuned = tmp_path / "converted", tmp_path / "data", tmp_path / "tuned"
    convert.from_hf(str(hf), str(converted), scan_layers=False, log=lambda _: None)
    prepare.prepare(inputs=[str(_corpus(tmp_path))], out_dir=str(data), tokenizer=str(converted), num_shards=1,
                    validation_fraction=0.3, seed=2, num_workers=1, log=lambda _: None)
    assert json.loads((data / "metadata.json").read_text())["tokenizer"]["decoder_start_id"] == VOCAB

    result = run_cli("train", "--gin_file=runs/quickstart.gin", f"--gin_file={converted / 'model.gin'}",
                     f"--gin.DATA_DIR='{data}'", f"--gin.MODEL_DIR='{tuned}'", "--gin.TRAIN_STEPS=3",
                     "--gin.SEQUENCE_LENGTH=32", "--gin.BATCH_SIZE=4", "--gin.train.log_period=1",
                     "--gin.train.eval_batches=1", "--gin.train.sample_prompt=None",
                     "--gin.WarmupCosine.warmup_steps=1", "--gin.train.init_from=@InitFrom()",
                     f"--gin.InitFrom.checkpoint='{converted}'")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "init_from: copied" in result.stdout + result.stderr
    assert (tuned / "hf" / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    assert not (tuned / "vocab" / "spm.model").exists()

    vocabulary = restored_model.restore(str(tuned)).vocabulary()
    assert (vocabulary.ids.eos, vocabulary.decoder_start_id, vocabulary.zero_is_token) == (VOCAB, VOCAB, True)
    capsys.readouterr()
    assert sample.main([f"--model_dir={tuned}", "--prompt=Hello! Привет", "--max_new_tokens=6", "--seed=1"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("[step 3]\nHello! Привет")  # the prompt decoded by the GPT-2 tokenizer

    out = tmp_path / "back"
    convert.to_hf(str(tuned), str(out), log=lambda _: None)
    assert (out / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    back = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    assert back(TEXT, add_special_tokens=False)["input_ids"] == vocabulary.encode(TEXT)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == VOCAB
