"""Hugging Face tokenizer files: which file a path names, its special token ids, where a model keeps it.

A tokenizer is a `tokenizer.json` (read with the `tokenizers` library) or a SentencePiece model
(`tokenizer.model`; `spiece.model` in T5 folders). A folder holding both is read through the
SentencePiece model (the same ids as its tokenizer.json; TensorFlow has a native op for it). The
special ids come from the JSON files beside it, the model's own first: config.json and
generation_config.json (`bos_token_id`, `eos_token_id`, `pad_token_id`), then
tokenizer_config.json and special_tokens_map.json (the tokens by name), then the SentencePiece
model's own ids, and for EOS alone a special token of a well-known name (`<|endoftext|>`, `</s>`,
`<eos>`, `<|end_of_text|>`).

The first token a decoder-only model reads (its "decoder start") is the tokenizer's BOS, or its
EOS when it has no BOS (what lm-evaluation-harness puts before a context); `decoder_start_id`
and `zero_is_token` read them off any vocabulary (seqio's own give 0 and False).

No TensorFlow, seqio or tokenizers here: `hf_vocabulary.py` builds the vocabularies.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from t5x_lite import storage
from t5x_lite.errors import TaskDataError

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_FILES = ("tokenizer.model", "spiece.model")
MODEL_CONFIG_FILES = ("config.json", "generation_config.json")  # ids by number, the model's own
TOKEN_NAME_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # ids by token name
HF_SUBDIR = "hf"  # a model directory's Hugging Face files (from-hf, init_from, a run's own tokenizer)
# EOS when no file names one: the special tokens GPT-2, LLaMA/Mistral, Gemma and LLaMA 3 end text with.
WELL_KNOWN_EOS = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
SPECIAL_NAMES = ("bos", "eos", "pad", "unk")


class TokenizerError(TaskDataError):
    """A tokenizer path or file cannot be used; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class TokenizerSource:
    """A tokenizer file and the folder it sits in (whose JSON files give its special ids)."""

    folder: str
    file: str  # the tokenizer file's name in `folder`

    @property
    def path(self) -> str:
        return storage.join(self.folder, self.file)

    @property
    def kind(self) -> str:
        """'tokenizer.json' or 'sentencepiece'."""
        return "sentencepiece" if self.file.endswith(".model") else "tokenizer.json"

    def companions(self) -> list[str]:
        """The JSON files beside the tokenizer that say which of its tokens are special."""
        return [name for name in (*MODEL_CONFIG_FILES, *TOKEN_NAME_FILES)
                if storage.exists(storage.join(self.folder, name))]


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The tokenizer's special token ids (None: it has no such token)."""

    bos: int | None = None
    eos: int | None = None
    pad: int | None = None
    unk: int | None = None

    @property
    def decoder_start(self) -> int:
        """The first input of a decoder-only model: BOS, else EOS, else 0."""
        for value in (self.bos, self.eos):
            if value is not None:
                return value
        return 0

    @property
    def zero_is_token(self) -> bool:
        """Whether id 0 is a real token (GPT-2's "!", LLaMA's <unk>) rather than the padding."""
        return self.pad != 0

    def to_json(self) -> dict[str, int | None]:
        return {f"{name}_id": getattr(self, name) for name in SPECIAL_NAMES}


class SpecialIdProperties:
    """A vocabulary's special ids read from its `ids` (SpecialIds): mixed into `TokenizerJsonVocabulary`."""

    ids: SpecialIds

    @property
    def bos_id(self) -> int | None:
        return self.ids.bos

    @property
    def eos_id(self) -> int | None:
        return self.ids.eos

    @property
    def unk_id(self) -> int | None:
        return self.ids.unk

    @property
    def decoder_start_id(self) -> int:
        return self.ids.decoder_start

    @property
    def zero_is_token(self) -> bool:
        return self.ids.zero_is_token


# ---------------------------------------------------------------------------- finding the file


def find_in_folder(folder: str) -> TokenizerSource | None:
    """The tokenizer of a folder (a SentencePiece model first, then tokenizer.json), or None."""
    if not storage.exists(folder):
        return None
    names = {name.rstrip("/") for name in storage.listdir(folder)}
    for name in (*SENTENCEPIECE_FILES, TOKENIZER_JSON):
        if name in names:
            return TokenizerSource(folder, name)
    return None


def find(path: str) -> TokenizerSource:
    """The tokenizer `path` names: a tokenizer.json or SentencePiece .model file, a Hugging Face
    folder holding one, or a t5x_lite model directory whose hf/ holds one (a from-hf conversion
    or a run trained on such a tokenizer). TokenizerError, naming the path and the fix, otherwise."""
    path = storage.absolute(path).rstrip("/")
    if not storage.exists(path):
        raise TokenizerError(f"--tokenizer={path!r} does not exist. Name a tokenizer.json, a SentencePiece "
                             "tokenizer.model, a Hugging Face model folder, or a converted model directory.")
    folder, _, name = path.rpartition("/")
    if name.endswith(".json") or name.endswith(".model"):
        return TokenizerSource(folder, name)
    if _is_file(path):
        raise TokenizerError(f"{path} is neither a tokenizer.json nor a SentencePiece .model file. Name one of "
                             "those, or the folder that holds it.")
    source = model_dir_tokenizer(path) if storage.exists(storage.join(path, HF_SUBDIR)) else None
    source = source or find_in_folder(path)
    run_vocabulary = storage.join(path, "vocab", "spm.model")
    if source is None and storage.exists(run_vocabulary):
        raise TokenizerError(f"{path}'s vocabulary is {run_vocabulary}, a SentencePiece model of `t5x-lite prepare` "
                             f"(seqio's ids), not a Hugging Face tokenizer: pass --vocab_model={run_vocabulary} "
                             "instead of --tokenizer.")
    if source is None:
        looked = ", ".join([TOKENIZER_JSON, *SENTENCEPIECE_FILES])
        raise TokenizerError(f"{path} holds no tokenizer (looked for {looked} in it and in its {HF_SUBDIR}/). "
                             "Name the tokenizer file itself, or the Hugging Face folder that holds it.")
    return source


def _is_file(path: str) -> bool:
    """A local file (an object store's path without a tokenizer's name is taken for a folder)."""
    return not storage.is_url(path) and os.path.isfile(path)


def model_dir_tokenizer(model_dir: str) -> TokenizerSource | None:
    """The tokenizer in MODEL_DIR/hf/ when it is the model's vocabulary, else None.

    A run keeps the SentencePiece model it trained with in vocab/spm.model; when that file is
    there, hf/'s tokenizer is the model's only if hf/ holds the same SentencePiece model (a from-hf
    conversion of LLaMA or T5, or a run on such a tokenizer). Otherwise (a run on a vocabulary of
    `prepare` that started from a converted GPT-2, say) hf/ only came with init_from.
    """
    source = find_in_folder(storage.join(model_dir, HF_SUBDIR))
    run_vocabulary = storage.join(model_dir, "vocab", "spm.model")
    if source is None or not storage.exists(run_vocabulary):
        return source
    hf_model = next((TokenizerSource(source.folder, name) for name in SENTENCEPIECE_FILES
                     if storage.exists(storage.join(source.folder, name))), None)
    if hf_model is not None and _read_bytes(hf_model.path) == _read_bytes(run_vocabulary):
        return hf_model
    return None


def _read_bytes(path: str) -> bytes:
    with storage.open(path, "rb") as f:
        return f.read()


def read_json(folder: str, name: str) -> dict[str, Any]:
    """A JSON object file of `folder` ({} when absent); TokenizerError when it is not valid JSON."""
    path = storage.join(folder, name)
    if not storage.exists(path):
        return {}
    try:
        with storage.open(path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path} is not valid JSON ({e}); fix or remove it.") from None
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------------- special ids


def special_ids(source: TokenizerSource, *, token_to_id: Callable[[str], int | None],
                own: SpecialIds = SpecialIds(), special_tokens: frozenset[str] = frozenset()) -> SpecialIds:
    """The special ids of `source`: config.json / generation_config.json, then tokenizer_config.json /
    special_tokens_map.json (names through `token_to_id`), then `own` (a SentencePiece model's ids),
    then, for EOS, the first of WELL_KNOWN_EOS among `special_tokens`."""
    by_id = [read_json(source.folder, name) for name in MODEL_CONFIG_FILES]
    by_name = [read_json(source.folder, name) for name in TOKEN_NAME_FILES]
    found = {}
    for name in SPECIAL_NAMES:
        candidates = [_id_field(config.get(f"{name}_token_id")) for config in by_id]
        candidates += [_token_field(config.get(f"{name}_token"), token_to_id) for config in by_name]
        candidates.append(getattr(own, name))
        found[name] = next((c for c in candidates if c is not None), None)
    if found["eos"] is None:
        found["eos"] = next((token_to_id(t) for t in WELL_KNOWN_EOS if t in special_tokens), None)
    return SpecialIds(**found)


def _id_field(value: Any) -> int | None:
    """An id of config.json: an int, or a list of them (generation's several EOS: the first)."""
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _token_field(value: Any, token_to_id: Callable[[str], int | None]) -> int | None:
    """A token of tokenizer_config.json: its text, or an AddedToken dict with `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return token_to_id(value) if isinstance(value, str) and value else None


def decoder_start_id(vocabulary: Any) -> int:
    """The first input token of a decoder-only model reading `vocabulary`'s ids: a Hugging Face
    tokenizer's BOS (else its EOS); 0 for seqio's vocabularies (their padding, seqio's convention)."""
    return int(getattr(vocabulary, "decoder_start_id", 0))


def zero_is_token(vocabulary: Any) -> bool:
    """Whether id 0 is a real token of `vocabulary` (not padding, as seqio's vocabularies have it)."""
    return bool(getattr(vocabulary, "zero_is_token", False))
