"""`t5x-lite sample --model_dir=DIR --prompt=TEXT`: generate text from a trained checkpoint.

Reads everything from the model directory (the checkpoint's metadata gives the model's
sizes, vocab/spm.model the vocabulary), so no gin file is needed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from t5x_lite import errors


def load_params(model_dir: str, step: int | None = None):
    """(model config, params, step) of a checkpoint in `model_dir` (the latest by default)."""
    from t5x_lite import checkpoint, loops, models

    model_dir, step = checkpoint.locate(model_dir, step)
    checkpoints = checkpoint.Checkpointer(model_dir, create=False)
    metadata = checkpoints.metadata(step)
    params = checkpoints.restore_params(step)
    checkpoints.close()
    if metadata["family"] != "decoder_only":
        raise loops.RunConfigError(f"{model_dir} holds a model of family {metadata['family']!r}; `sample` generates "
                                   "from decoder-only models.")
    return models.config_from_dict(metadata["family"], metadata["model"]), params, step


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite sample", description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="a model directory written by `t5x-lite train`")
    parser.add_argument("--prompt", default="", help="text to continue")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    parser.add_argument("--top_k", type=int, default=40, help="0 disables top-k filtering")
    parser.add_argument("--top_p", type=float, default=1.0, help="1 disables nucleus filtering")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with errors.reported():
        import seqio

        from t5x_lite import loops

        model, params, step = load_params(args.model_dir, args.step)
        vocabulary = seqio.SentencePieceVocabulary(os.path.join(args.model_dir, "vocab", "spm.model"))
        text = loops.sample_text(model=model, params=params, vocabulary=vocabulary, prompt=args.prompt,
                                 max_new_tokens=args.max_new_tokens, seed=args.seed,
                                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        print(f"[step {step}]\n{args.prompt}{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
