"""Vocabularies from a path, a prepared directory or a model directory (no TensorFlow or seqio:
`seqio_vocabularies.as_seqio` makes a seqio task's vocabulary of one).

`load` builds the vocabulary of a `tokenizer_files.TokenizerSource` (a tokenizer.json or a
SentencePiece model, with the special ids of its folder). A directory prepared with
`t5x-lite prepare --tokenizer` holds a copy in tokenizer/ and its ids in metadata.json, one
prepared without it a SentencePiece model with seqio's ids (`prepared_vocabulary`); a model
directory holds the Hugging Face tokenizer it reads text with in hf/ (`model_dir_vocabulary`),
which `write_model_dir_files` fills for a run trained on one.
"""

from __future__ import annotations

import os
from typing import Any

import sentencepiece

from t5x_lite import storage
from t5x_lite.data.records.prepared_dataset import TOKENIZER_SUBDIR
from t5x_lite.data.vocab import sentencepiece_vocabulary, tokenizer_files, tokenizer_json
from t5x_lite.data.vocab.base import Vocabulary
from t5x_lite.data.vocab.sentencepiece_vocabulary import SentencePieceVocabulary
from t5x_lite.data.vocab.tokenizer_files import TOKEN_NAME_FILES, SpecialIds, TokenizerSource

PREPARED_SUBDIR = TOKENIZER_SUBDIR  # in a prepared directory: the copy of its tokenizer


def load(source: TokenizerSource, *, ids: SpecialIds | None = None, extra_ids: int = 0) -> Vocabulary:
    """The vocabulary of `source`, with `ids` (default: read from its folder, `tokenizer_files.special_ids`)."""
    if source.kind == "sentencepiece":
        if ids is None:
            model = sentencepiece_vocabulary.read_model(source.path)
            processor = sentencepiece.SentencePieceProcessor(model_proto=model)
            pieces = frozenset(processor.id_to_piece(i) for i in range(processor.vocab_size())
                               if processor.is_control(i) or processor.is_unknown(i))

            def piece_id(token: str) -> int | None:
                i = processor.piece_to_id(token)
                return i if processor.id_to_piece(i) == token else None

            ids = tokenizer_files.special_ids(source, token_to_id=piece_id,
                                              own=sentencepiece_vocabulary.own_ids(model), special_tokens=pieces)
        return SentencePieceVocabulary(source.path, ids=ids, extra_ids=extra_ids)

    if ids is None:
        tokenizer = tokenizer_json.load_tokenizer(source.path)
        specials = frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)
        ids = tokenizer_files.special_ids(source, token_to_id=tokenizer.token_to_id, special_tokens=specials)
    return tokenizer_json.TokenizerJsonVocabulary(source.path, ids=ids, extra_ids=extra_ids)


def load_path(path: str, *, extra_ids: int = 0) -> Vocabulary:
    """The vocabulary of a tokenizer file, a Hugging Face folder or a converted model directory."""
    return load(tokenizer_files.find(path), extra_ids=extra_ids)


# ---------------------------------------------------------------------------- prepared directories


def copy_for_prepared(source: TokenizerSource, out_dir: str) -> TokenizerSource:
    """Copies the tokenizer file and its tokenizer_config.json / special_tokens_map.json into
    `out_dir`/tokenizer/ (local); returns the copy. The ids go into metadata.json (`metadata_entry`)."""
    folder = os.path.join(out_dir, PREPARED_SUBDIR)
    os.makedirs(folder, exist_ok=True)
    for name in [source.file, *(n for n in TOKEN_NAME_FILES if storage.exists(storage.join(source.folder, n)))]:
        storage.copy(storage.join(source.folder, name), os.path.join(folder, name))
    return TokenizerSource(folder, source.file)


def metadata_entry(source: TokenizerSource, vocabulary: Vocabulary, *, given: str) -> dict[str, Any]:
    """metadata.json's `tokenizer`: where the copy is, where it came from, its kind and special ids."""
    return {"file": f"{PREPARED_SUBDIR}/{source.file}", "kind": source.kind, "source": given,
            **vocabulary.ids.to_json(), "decoder_start_id": vocabulary.decoder_start_id,
            "zero_is_token": vocabulary.zero_is_token}


def prepared_vocabulary(data_dir: str, metadata: dict[str, Any], *, extra_ids: int = 0) -> Vocabulary:
    """The vocabulary of a prepared directory (its metadata.json: `metadata`): prepared with --tokenizer,
    its copy with the ids metadata.json records; else its SentencePiece model, with seqio's ids."""
    if "tokenizer" not in metadata:
        return SentencePieceVocabulary(storage.join(data_dir, metadata["vocabulary"]), extra_ids=extra_ids)
    entry = metadata["tokenizer"]
    folder, _, name = storage.join(data_dir, entry["file"]).rpartition("/")
    ids = SpecialIds(**{n: entry.get(f"{n}_id") for n in tokenizer_files.SPECIAL_NAMES})
    return load(TokenizerSource(folder, name), ids=ids, extra_ids=extra_ids)


# ---------------------------------------------------------------------------- model directories


def model_dir_vocabulary(model_dir: str) -> Vocabulary | None:
    """The Hugging Face tokenizer MODEL_DIR/hf/ holds, when it is the model's vocabulary; else None
    (then vocab/spm.model, if any, is: `tokenizer_files.model_dir_tokenizer`)."""
    source = tokenizer_files.model_dir_tokenizer(model_dir)
    return None if source is None else load(source)


def write_model_dir_files(vocabulary: Any, model_dir: str) -> list[str]:
    """A run's Hugging Face tokenizer (its file and the JSON files naming its special tokens) copied
    into `model_dir`/hf/, where `model_dir_vocabulary`, sample, eval, infer and to-hf read it; the
    names copied (none for a vocabulary with seqio's ids, which has no Hugging Face `ids`)."""
    files = getattr(vocabulary, "files", None)
    if not files or getattr(vocabulary, "ids", None) is None:
        return []
    folder = storage.join(model_dir, tokenizer_files.HF_SUBDIR)
    storage.makedirs(folder)
    source_folder = files[0].rpartition("/")[0]
    names = [path.rpartition("/")[2] for path in files]
    names += [n for n in TOKEN_NAME_FILES if storage.exists(storage.join(source_folder, n))]
    for name in names:
        storage.copy(storage.join(source_folder, name), storage.join(folder, name))
    return names

