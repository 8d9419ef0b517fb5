"""The run's special tokens in an export: the ids of config.json and generation_config.json, the
strings of tokenizer_config.json, so transformers' `generate` stops where the run's sampler does.

The ids are those the model was trained and samples with: its vocabulary's (MODEL_DIR/hf/'s
tokenizer when it is the model's, else vocab/spm.model with seqio's ids), never transformers'
defaults for the architecture (LLaMA's eos 2, say). BOS is the vocabulary's own, or for a causal
LM whose tokenizer has none the token its prompts start from (its EOS, as GPT-2's config.json has
it); an encoder-decoder's decoder starts from id 0 (`decoder_start_token_id`). A value the
directory's original config.json already holds is kept when it names the same token (a list of
several EOS ids that holds the run's, say).
"""

from __future__ import annotations

import json
import os
from typing import Any

from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.models import BaseModel
from t5x_lite.models.generation import PAD_ID

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _id(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def run_ids(model: BaseModel, vocabulary: Any | None) -> dict[str, int | None]:
    """{bos,eos,pad,decoder_start}_token_id of the run (None: it has no such token; decoder start: encoder-decoders
    only). Without a vocabulary only the decoder start is known, and the other fields are left out."""
    start = {"decoder_start_token_id": None if model.continues_text else PAD_ID}  # encoder_decoder_generation.py's
    if vocabulary is None:
        return {k: v for k, v in start.items() if v is not None}
    ids: dict[str, int | None] = {name: None for name in ID_FIELDS} | start
    own = getattr(vocabulary, "ids", None)  # a Hugging Face tokenizer's SpecialIds; None: seqio's ids
    pad = own.pad if own is not None else PAD_ID
    bos = _id(vocabulary.bos_id)
    if bos is None and model.continues_text:
        start = tokenizer_files.decoder_start_id(vocabulary)
        bos = start if start != pad else None  # seqio's start is its padding, which Hugging Face does not name BOS
    ids.update(bos_token_id=bos, eos_token_id=_id(vocabulary.eos_id),
               pad_token_id=PAD_ID if not model.continues_text else _id(pad))
    return ids


def merged(config: dict[str, Any], ids: dict[str, int | None], fields: tuple[str, ...] = ID_FIELDS) -> dict[str, Any]:
    """`config` with `ids` written in: a value it holds is kept when it names the run's token (equal, or a list
    holding it); a field the run has no token for (None) is dropped, one `ids` leaves out is kept."""
    out = dict(config)
    for field in fields:
        if field not in ids:
            continue
        ours, theirs = ids[field], out.get(field)
        if ours is None:
            out.pop(field, None)
        elif not (theirs == ours or (isinstance(theirs, list) and ours in theirs)):
            out[field] = ours
    return out


def write_generation_config(folder: str, ids: dict[str, int | None]) -> None:
    """generation_config.json with the run's ids (a copied one's other settings kept); its pad is the run's,
    or its EOS when it has none (what `generate` would choose, without its warning). Written when the
    run has a vocabulary or hf/ had one."""
    path = os.path.join(folder, GENERATION_CONFIG)
    config = {}
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    elif "eos_token_id" not in ids:
        return  # no vocabulary, nothing copied: config.json says all there is
    config.pop("transformers_version", None)
    ids = dict(ids)
    if "pad_token_id" in ids and ids["pad_token_id"] is None:
        ids["pad_token_id"] = ids.get("eos_token_id")
    with open(path, "w") as f:
        json.dump(merged(config, ids), f, indent=2, sort_keys=True)


def _token(vocabulary: Any, token_id: int | None) -> str | None:
    """The text of token `token_id` (a tokenizer.json's or a SentencePiece model's piece)."""
    if token_id is None:
        return None
    tokenizer = vocabulary.tokenizer
    if hasattr(tokenizer, "id_to_token"):
        return tokenizer.id_to_token(token_id)
    return tokenizer.id_to_piece(token_id)


def write_tokenizer_config(folder: str, vocabulary: Any, ids: dict[str, int | None]) -> bool:
    """tokenizer_config.json naming the run's special tokens, so AutoTokenizer loads the folder's
    tokenizer.json with the run's EOS and padding: the copied one's own entries kept, missing ones
    added; a bare tokenizer.json gets one (`PreTrainedTokenizerFast`). Returns whether it wrote one."""
    path = os.path.join(folder, TOKENIZER_CONFIG)
    has_json = os.path.exists(os.path.join(folder, tokenizer_files.TOKENIZER_JSON))
    config = {}
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    elif not has_json:
        return False  # a SentencePiece model alone: transformers picks its class from config.json
    if has_json:
        config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    unk = _id(vocabulary.unk_id)
    for name, token_id in (("bos", ids["bos_token_id"]), ("eos", ids["eos_token_id"]), ("pad", ids["pad_token_id"]),
                           ("unk", unk)):
        text = _token(vocabulary, token_id)
        if text is not None and config.get(f"{name}_token") is None:
            config[f"{name}_token"] = text
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return True
