"""`t5x-lite sample --model_dir=DIR --prompt=TEXT`: generate text from a trained checkpoint.

Reads everything from the model directory (the checkpoint's metadata gives the model's
sizes, vocab/spm.model the vocabulary), so no gin file is needed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from t5x_lite import errors
from t5x_lite.errors import ConfigValueError


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
        from t5x_lite import loops, restored_model

        restored = restored_model.restore(args.model_dir, step=args.step)
        if restored.config.family != "decoder_only":
            raise ConfigValueError(f"{args.model_dir} holds a {restored.config.family} model; `sample` continues "
                                   "text with decoder-only models (use `t5x-lite infer` for encoder-decoders).")
        [text] = loops.sample_texts(model=restored.config, params=restored.params, vocabulary=restored.vocabulary(),
                                    prompts=[args.prompt], max_new_tokens=args.max_new_tokens, seed=args.seed,
                                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        print(f"[step {restored.step}]\n{args.prompt}{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
