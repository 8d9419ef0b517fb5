"""How a prompt's text becomes the ids a model reads: the one rule `infer`, `sample` and the task route share.

An encoder-decoder reads a prompt as its inputs, which end with EOS: seqio's text-to-text and
span-corruption tasks give their `inputs` feature `add_eos=True` (seqio's `append_eos` appends it),
and Hugging Face's T5 tokenizer appends `</s>` too, so a T5 trained either way has seen every input
end with it. A causal LM continues its prompt, so nothing is appended. A task's split read as
prompts carries the ids its own preprocessors made; `task_encoding_note` names the case where
those differ from what this rule gives a prompt's text (a task whose `inputs` feature says
otherwise), so the two routes never differ silently.
"""

from __future__ import annotations

from typing import Any

from t5x_lite.errors import TaskDataError
from t5x_lite.models import BaseModel


def inputs_end_with_eos(model: BaseModel) -> bool:
    """Whether a prompt's ids end with EOS for `model`: an encoder-decoder's inputs do, a causal LM's prompt
    does not."""
    return not model.continues_text


def describe(model: BaseModel) -> str:
    """How `model`'s prompts are encoded, in words (what infer's manifest and notes say)."""
    return "text then EOS" if inputs_end_with_eos(model) else "text"


def encode_prompt(model: BaseModel, vocabulary: Any, text: str) -> list[int]:
    """`text`'s ids as `model` reads a prompt: the vocabulary's ids, then its EOS for an encoder-decoder."""
    ids = list(vocabulary.encode(text))
    if inputs_end_with_eos(model):
        if vocabulary.eos_id is None:
            raise TaskDataError(f"The vocabulary {vocabulary} has no EOS token, which ends an encoder-decoder's "
                                "inputs; use a tokenizer that names one (docs/interop.md, Tokenizers).")
        ids.append(int(vocabulary.eos_id))
    return ids


def task_encoding_note(model: BaseModel, task_name: str, task_adds_eos: bool) -> str | None:
    """None when a task's `inputs` (EOS appended when its feature's `add_eos`) are encoded as `encode_prompt`
    encodes text for `model`; else one line naming the difference between the task route and a prompts file."""
    if task_adds_eos == inputs_end_with_eos(model):
        return None
    task_way = "end with EOS" if task_adds_eos else "do not end with EOS"
    prompt_way = ("end with EOS (an encoder-decoder's inputs)" if inputs_end_with_eos(model)
                  else "do not (a causal LM continues its prompt)")
    return (f"note: the inputs of task {task_name!r} {task_way} (its 'inputs' feature's add_eos={task_adds_eos}); "
            f"a prompts file's prompts for this {model.family} model {prompt_way}, so the same text gives other "
            "outputs through infer.prompts_file than through the task.")
