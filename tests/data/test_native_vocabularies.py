"""Vocabularies without TensorFlow or seqio: the same ids and texts as seqio's, and no import of either.

A SentencePiece model of `prepare`'s settings (pad 0, eos 1, unk 2, no BOS) and one of LLaMA's
(unk 0, bos 1, eos 2, no pad) are trained here; `SentencePieceVocabulary` with seqio's ids must
answer as `seqio.SentencePieceVocabulary` does on every text and id list (EOS in the middle, ids
past the model, sentinels, nothing), with and without extra ids. The Hugging Face kinds are
compared with their former behaviour in tests/data/test_hf_tokenizers.py.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import sentencepiece

from t5x_lite.data.preparation import spm_vocabulary
from t5x_lite.data.vocab import hf_vocabulary
from t5x_lite.data.vocab.sentencepiece_vocabulary import SentencePieceVocabulary
from t5x_lite.data.vocab.tokenizer_files import SpecialIds

CORPUS = ["The quick brown fox jumps over the lazy dog! " * 3, "Ça va? Élève naïve — façade, très bien.",
          "Привет, мир! Съешь же ещё этих мягких французских булок.", "你好，世界。机器学习 深度学习",
          "def f(x):\n\treturn x + 1\n\nfor i in range(10):\n\tprint(i)  # loop\n", "Numbers 12345 and 67890."] * 8
TEXTS = ["", " ", "The quick brown fox!", "  leading and trailing  ", "Grüße, 漢字 🦀 ß\n\ttabs\n",
         "def g(y):\n\treturn y * 2", "<extra_id_0> sentinel text", "unseen: ʘ‿ʘ ∮ ⅋", "12345"]
VOCAB = 360


def _llama_model() -> bytes:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=VOCAB, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, byte_fallback=True, split_digits=True, character_coverage=0.9995, num_threads=1,
        minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Two SentencePiece model files: `prepare`'s ids and LLaMA's."""
    folder = tmp_path_factory.mktemp("spm")
    paths = {"prepare": folder / "spm.model", "llama": folder / "tokenizer.model"}
    paths["prepare"].write_bytes(spm_vocabulary.train_vocabulary(CORPUS, vocab_size=VOCAB, seed=0, num_threads=1))
    paths["llama"].write_bytes(_llama_model())
    return {kind: str(path) for kind, path in paths.items()}


def _id_lists(vocab_size: int, eos: int, encoded: list[int]) -> list[list[int]]:
    return [[], encoded, [*encoded, eos, *encoded], [eos], [*encoded[:3], eos, eos, 5], [3, vocab_size, 4],
            [vocab_size + 10, *encoded[:2], vocab_size - 1], list(range(vocab_size - 6, vocab_size)),
            [vocab_size - 1, vocab_size - 2, eos, vocab_size + 1]]


@pytest.mark.parametrize("kind", ["prepare", "llama"])
@pytest.mark.parametrize("extra_ids", [0, 5])
def test_seqio_ids_answer_as_seqios_sentencepiece_vocabulary(kind, extra_ids, models):
    from t5x_lite.tf_setup import import_tensorflow

    tf = import_tensorflow()
    import seqio

    from t5x_lite.data.vocab import seqio_vocabularies

    native = SentencePieceVocabulary(models[kind], extra_ids=extra_ids)
    reference = seqio.SentencePieceVocabulary(models[kind], extra_ids=extra_ids)
    names = ("vocab_size", "eos_id", "pad_id", "unk_id", "bos_id", "extra_ids")
    assert {n: getattr(native, n) for n in names} == {n: getattr(reference, n) for n in names}
    assert native.vocab_size == VOCAB + extra_ids and native.eos_id == {"prepare": 1, "llama": 2}[kind]
    assert (native.decoder_start_id, native.zero_is_token) == (0, False)
    for text in TEXTS:
        ids = native.encode(text)
        assert ids == reference.encode(text) and isinstance(ids, list)
        for id_list in _id_lists(native.vocab_size, native.eos_id, ids):
            assert native.decode(id_list) == reference.decode(id_list), id_list
            assert native.decode(np.asarray(id_list, np.int32)) == reference.decode(id_list)
        assert native.decode(tf.constant(ids, tf.int32)) == reference.decode(ids)
    if extra_ids:  # sentinels are the last ids, <extra_id_0> the highest
        assert native.tokenizer.id_to_piece(native.vocab_size - 1) == "▁<extra_id_0>"
        sentinel = native.decode([native.vocab_size - 1])
        assert sentinel == reference.decode([native.vocab_size - 1]) and sentinel.strip() == "<extra_id_0>"
    assert seqio_vocabularies.as_seqio(native) == reference
    assert type(seqio_vocabularies.as_seqio(native)) is seqio.SentencePieceVocabulary
    assert seqio_vocabularies.as_seqio(reference) is reference


def test_the_hugging_face_ids_answer_as_seqios_class_with_those_ids(models):
    """With `ids`, the special ids are those and the rest is seqio's SentencePieceVocabulary in Python."""
    import seqio

    from t5x_lite.data.vocab import seqio_vocabularies

    ids = SpecialIds(bos=1, eos=2, unk=0)

    class Reference(seqio.SentencePieceVocabulary):  # what the seqio subclass was: seqio's Python with these ids
        bos_id, eos_id, unk_id = ids.bos, ids.eos, ids.unk

    native = SentencePieceVocabulary(models["llama"], extra_ids=3, ids=ids)
    reference = Reference(models["llama"], extra_ids=3)
    assert (native.decoder_start_id, native.zero_is_token, native.files) == (1, True, [models["llama"]])
    assert (native.vocab_size, native.bos_id, native.eos_id, native.unk_id, native.pad_id) == \
        (reference.vocab_size, 1, 2, 0, 0)
    for text in TEXTS:
        encoded = native.encode(text)
        assert encoded == reference.encode(text)
        for id_list in _id_lists(native.vocab_size, 2, encoded):
            assert native.decode(id_list) == reference.decode(id_list), id_list
    seqio_vocabulary = seqio_vocabularies.as_seqio(native)
    assert isinstance(seqio_vocabulary, seqio_vocabularies.HfSentencePieceVocabulary)
    assert (seqio_vocabulary.ids, seqio_vocabulary.decoder_start_id, seqio_vocabulary.vocab_size) == \
        (ids, 1, VOCAB + 3)
    assert seqio_vocabulary.sp_model == native.sp_model and seqio_vocabulary.tokenizer is native.tokenizer


def test_loading_is_once_across_threads_and_a_pickled_copy_reads_the_model_again(models):
    native = SentencePieceVocabulary(models["prepare"], extra_ids=2)
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(native.tokenizer)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and all(t is seen[0] for t in seen)
    state = native.__getstate__()
    assert state["_model"] is None and native._model is not None  # the processor stays out of a pickle
    copy = pickle.loads(pickle.dumps(native))
    assert copy == native and hash(copy) == hash(native) and copy.encode(TEXTS[4]) == native.encode(TEXTS[4])
    assert copy != SentencePieceVocabulary(models["prepare"], extra_ids=3)
    assert copy != SentencePieceVocabulary(models["prepare"], extra_ids=2, ids=SpecialIds(eos=1, pad=0, unk=2))


def test_a_prepared_directory_without_a_tokenizer_reads_its_spm_model_with_seqios_ids(models, tmp_path):
    (tmp_path / "spm.model").write_bytes(open(models["prepare"], "rb").read())
    vocabulary = hf_vocabulary.prepared_vocabulary(str(tmp_path), {"vocabulary": "spm.model"}, extra_ids=4)
    assert vocabulary == SentencePieceVocabulary(str(tmp_path / "spm.model"), extra_ids=4)
    assert vocabulary.ids is None and hf_vocabulary.write_model_dir_files(vocabulary, str(tmp_path / "run")) == []


def test_a_model_on_s3_is_read_through_storage(models, s3_server):
    from t5x_lite import storage
    from tests.conftest import S3_BUCKET

    path = f"s3://{S3_BUCKET}/native_vocab/spm.model"
    storage.copy(models["prepare"], path)
    native, local = SentencePieceVocabulary(path, extra_ids=2), SentencePieceVocabulary(models["prepare"], extra_ids=2)
    assert native.vocab_size == local.vocab_size and native.encode(TEXTS[4]) == local.encode(TEXTS[4])

    from t5x_lite.data.vocab import seqio_vocabularies

    seqio_vocabulary = seqio_vocabularies.as_seqio(native)  # seqio's own class, reading a local copy
    assert isinstance(seqio_vocabulary, seqio_vocabularies.S3SentencePieceVocabulary)
    assert seqio_vocabulary.encode(TEXTS[4]) == local.encode(TEXTS[4])


# ------------------------------------------------------------------------- without TensorFlow or seqio

_BLOCKED = ("tensorflow", "tensorflow_text", "seqio", "t5")

_WITHOUT_TF = textwrap.dedent("""
    import json, sys
    from t5x_lite.checkpoints.restored_model import RestoredModel
    from t5x_lite.data.vocab import hf_vocabulary, tokenizer_files
    from t5x_lite.data.vocab.sentencepiece_vocabulary import SentencePieceVocabulary

    args = json.loads(sys.argv[1])
    out = {}
    spm = SentencePieceVocabulary(args["spm"], extra_ids=2)
    out["spm"] = [spm.encode(args["text"]), spm.decode(spm.encode(args["text"]) + [1, 5]), spm.vocab_size]
    llama = hf_vocabulary.load_path(args["llama_folder"])
    out["llama"] = [llama.encode(args["text"]), llama.decode(llama.encode(args["text"]) + [2, 5]),
                    tokenizer_files.decoder_start_id(llama), tokenizer_files.zero_is_token(llama)]
    restored = RestoredModel(config=None, params=None, step=0, model_dir=args["model_dir"], placement=None)
    vocabulary = restored.vocabulary()
    out["restored"] = [type(vocabulary).__name__, vocabulary.encode(args["text"])]
    if args["gpt2"]:
        gpt2 = hf_vocabulary.load_path(args["gpt2"])
        out["gpt2"] = [gpt2.encode(args["text"]), gpt2.decode(gpt2.encode(args["text"]) + [gpt2.eos_id, 3])]
    out["loaded"] = sorted(m for m in %r if m in sys.modules)
    print(json.dumps(out))
""" % (_BLOCKED,))


def _blocking_path(tmp_path) -> str:
    """A directory whose tensorflow, seqio and t5 packages raise ImportError."""
    blocked = tmp_path / "blocked"
    for name in _BLOCKED:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text('raise ImportError("blocked")\n')
    return str(blocked)


def _gpt2_like_tokenizer(folder) -> str | None:
    """A small byte-level BPE tokenizer.json with <|endoftext|> (None without the `tokenizers` package)."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        return None
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.add_special_tokens(["<|endoftext|>"])
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return str(folder)


def test_the_vocabularies_work_where_tensorflow_seqio_and_t5_cannot_be_imported(models, tmp_path):
    llama_folder, model_dir = tmp_path / "llama", tmp_path / "run"
    llama_folder.mkdir()
    (llama_folder / "tokenizer.model").write_bytes(open(models["llama"], "rb").read())
    (model_dir / "vocab").mkdir(parents=True)
    (model_dir / "vocab" / "spm.model").write_bytes(open(models["prepare"], "rb").read())
    gpt2 = _gpt2_like_tokenizer(tmp_path / "gpt2")
    text = TEXTS[4]
    args = {"spm": models["prepare"], "llama_folder": str(llama_folder), "model_dir": str(model_dir),
            "gpt2": gpt2, "text": text}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_blocking_path(tmp_path), os.getcwd()])}
    blocked = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert "ImportError: blocked" in blocked.stderr  # the block itself works
    result = subprocess.run([sys.executable, "-c", _WITHOUT_TF, json.dumps(args)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])

    spm = SentencePieceVocabulary(models["prepare"], extra_ids=2)
    assert out["spm"] == [spm.encode(text), text, VOCAB + 2]
    llama = hf_vocabulary.load_path(str(llama_folder))
    assert out["llama"] == [llama.encode(text), llama.decode(llama.encode(text)), 1, True]
    assert out["restored"] == ["SentencePieceVocabulary", spm.encode(text)]
    if gpt2:
        assert out["gpt2"] == [hf_vocabulary.load_path(gpt2).encode(text), text]
    assert out["loaded"] == []
