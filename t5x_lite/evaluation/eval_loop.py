"""The eval loop: evaluate one checkpoint, the latest, or every checkpoint of a model directory.

Each evaluated step writes OUTPUT_DIR/step_<N>.json (all results of that step, written
whole: a killed evaluation leaves no partial file) and its scalars to `metric_writers`
(TensorBoard under OUTPUT_DIR/tb/ by default; W&B and MLflow: runs of their own, their ids kept
in OUTPUT_DIR/tracking/); a step whose JSON exists is skipped, so an evaluation that is run
again, or that follows a training run (`wait_seconds`), evaluates only what is new. A step
listed before its trainer wrote its manifest is looked at again until it is written
(MANIFEST_WAIT_SECONDS), never dropped without a warning.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Iterator, Sequence

import gin
import jax

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint, lease, lookup, restored_model
from t5x_lite.data import task_access, task_modules
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import ConfigValueError, TaskDataError
from t5x_lite.evaluation import multiple_choice as multiple_choice_lib
from t5x_lite.evaluation import perplexity as perplexity_eval
from t5x_lite.evaluation import seqio_metrics
from t5x_lite.inference import predict
from t5x_lite.metrics import tracking
from t5x_lite.metrics.writer import DEFAULT_WRITERS, MetricsWriter
from t5x_lite.models import BaseModel
from t5x_lite.parallel import distributed
from t5x_lite.parallel.placement import Placement


@dataclasses.dataclass(frozen=True)
class PerplexityEval:
    """Perplexity of a task's split, every document scored whole in strided windows.

    Attributes:
      mixture_or_task_name: a registered seqio task or mixture; its `targets` are the documents.
      split: the split to score.
      context_length: tokens per model call; None means the model's max_len.
      stride: a new window starts every `stride` tokens and scores only the tokens no earlier
        window scored (each with at least context_length - stride tokens of context); None
        means context_length // 2. stride == context_length gives disjoint windows.
      batch_size: windows per model call; results do not depend on it.
      max_documents: score only the first N documents (None: the whole split).
      max_document_tokens: longer documents are cut into pieces of this many tokens by the
        task's own splitting preprocessor, each piece scored from its start.
    """

    mixture_or_task_name: str
    split: str = "validation"
    context_length: int | None = None
    stride: int | None = None
    batch_size: int = 8
    max_documents: int | None = None
    max_document_tokens: int = 65536


@dataclasses.dataclass(frozen=True)
class MultipleChoiceEval:
    """Multiple-choice accuracy (HellaSwag format) of a decoder-only model.

    Attributes:
      path: a jsonl file in HellaSwag's public format (ctx_a, ctx_b, activity_label, endings,
        label) or {"context", "endings", "label"} lines.
      name: the results' key and TensorBoard folder.
      batch_size: (context, ending) pairs per model call; results do not depend on it.
      max_examples: score only the first N examples (None: all).
    """

    path: str
    name: str = "hellaswag"
    batch_size: int = 8
    max_examples: int | None = None


@dataclasses.dataclass(frozen=True)
class SeqioEval:
    """A seqio task's (or mixture's) `metric_fns`, run through `seqio.Evaluator`.

    Attributes:
      mixture_or_task_name: a registered task or mixture with metric_fns (data/tasks/text_to_text.py).
      split: the split to evaluate.
      batch_size: prompts per decoding call.
      num_examples: evaluate only the first N examples (None: all).
      decoding: how predictions are generated (predict.DecodingConfig).
    """

    mixture_or_task_name: str
    split: str = "validation"
    batch_size: int = 8
    num_examples: int | None = None
    decoding: predict.DecodingConfig = predict.DecodingConfig()


def steps_to_evaluate(available: Sequence[int], done: set[int], *, step: int | None,
                      every_checkpoint: bool) -> list[int]:
    """Which checkpoints to evaluate now: `step`, or every one not yet done, or the latest if not done."""
    if step is not None:
        if step not in available:
            raise lookup.CheckpointNotFoundError(f"no checkpoint at step {step}; available: {list(available)}.")
        return [step]
    if every_checkpoint:
        return [s for s in sorted(available) if s not in done]
    return [max(available)] if available and max(available) not in done else []


def result_path(output_dir: str, step: int) -> str:
    return storage.join(output_dir, f"step_{step}.json")


def evaluate(
    *,
    model_dir: str | None,
    step: int | None = None,
    every_checkpoint: bool = False,
    wait_seconds: float = 0.0,
    poll_seconds: float = 10.0,
    final_step: int | None = None,
    output_dir: str | None = None,
    model: BaseModel | None = None,
    task_module: str | None = None,
    perplexity: PerplexityEval | None = None,
    multiple_choice: Sequence[MultipleChoiceEval] = (),
    seqio_evals: Sequence[SeqioEval] = (),
    mesh_axes: Sequence[tuple[str, int]] | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    metric_writers: Sequence[tracking.MetricWriter] = DEFAULT_WRITERS,
) -> dict[int, dict[str, Any]]:
    """Evaluates checkpoints of `model_dir`; returns {step: results} of the steps evaluated now.

    Args:
      model_dir: a training run's MODEL_DIR (local, gs:// or s3://), or one step's directory
        MODEL_DIR/checkpoints/<step> (that step is evaluated; t5x's CHECKPOINT_PATH).
      step: evaluate this step only (even if done before). None: the latest, or every
        checkpoint with `every_checkpoint`.
      every_checkpoint: evaluate every checkpoint not evaluated yet (oldest first).
      wait_seconds: after that, keep watching for new checkpoints (a training run writing
        them) until none has appeared for this long; 0 returns at once.
      poll_seconds: how often to look for new checkpoints while waiting.
      final_step: stop waiting once this step has been evaluated (the run's TRAIN_STEPS).
      output_dir: where results go; None means MODEL_DIR/eval.
      model: a model config to check the checkpoint against (None: the checkpoint's own).
      task_module: a module of seqio task registrations to import first.
      perplexity: strided perplexity of a task's split (PerplexityEval), or None.
      multiple_choice: multiple-choice sets (MultipleChoiceEval), decoder-only models.
      seqio_evals: seqio tasks with metric_fns (SeqioEval).
      mesh_axes: the mesh the params are sharded over, as in training (a gin/mesh file's
        MESH_AXES); None: data parallel over every device when the model fits on one, else FSDP.
      logical_axis_rules: the rule table (LOGICAL_AXIS_RULES); None: partitioning.DEFAULT_RULES.
      metric_writers: where the scalars go: [@TensorBoardWriter()] (OUTPUT_DIR/tb/), @WandbWriter(),
        @MlflowWriter() (an evaluation run of their own, docs/metrics.md); none when OUTPUT_DIR is
        gs:// or s3:// (its step_<N>.json files are still written).
    """
    if perplexity is None and not multiple_choice and not seqio_evals:
        raise ConfigValueError("Nothing to evaluate: set evaluate.perplexity, evaluate.multiple_choice or "
                               "evaluate.seqio_evals (see gin/runs/eval.gin).")
    tracking.check_writers(metric_writers, name="evaluate.metric_writers")
    if task_module:
        task_modules.import_task_module(task_module)
    lookup.require_model_dir(model_dir, "eval")
    named = storage.absolute(model_dir).rstrip("/")
    # Fails clearly when there is no checkpoint at all; _watch reports each step it skips.
    model_dir, located = lookup.locate(model_dir, warn=lambda _: None)
    if model_dir.rstrip("/") != named and step is None and not every_checkpoint:
        step = located  # a step directory (t5x's CHECKPOINT_PATH names one): that step
    output_dir = output_dir or storage.join(model_dir, "eval")
    evaluators = _Evaluators(perplexity=perplexity, multiple_choice=multiple_choice, seqio_evals=seqio_evals,
                             output_dir=output_dir)
    # Every process scores its share of each batch on the mesh; process 0 writes the results.
    chief = distributed.is_chief()
    writer = MetricsWriter(output_dir, total_steps=None, initial_step=0, progress_bar=False,
                           enabled=chief and not storage.is_url(output_dir), writers=metric_writers,
                           config_text=gin.operative_config_str())
    evaluated: dict[int, dict[str, Any]] = {}
    status = "FINISHED"
    try:
        for chosen in _watch(model_dir, output_dir, step=step, every_checkpoint=every_checkpoint,
                             wait_seconds=wait_seconds, poll_seconds=poll_seconds, final_step=final_step):
            restored = restored_model.restore(model_dir, step=chosen, expected=model, mesh_axes=mesh_axes,
                                              rules=logical_axis_rules)
            if not evaluated:
                _say(f"evaluating on {restored.placement.describe()}")
            results = evaluators.run(restored)
            _report_share(restored)
            if chief:
                _write_results(output_dir, chosen, results)
            for name, values in _scalar_groups(results):
                writer.scalars(name, chosen, values)
            evaluated[chosen] = results
        if not evaluated:
            _say(f"nothing to evaluate: every checkpoint asked for already has its results in {output_dir} "
                 "(name one with evaluate.step to evaluate it again)")
    except BaseException as e:
        status = tracking.exit_status(e)  # the tracked runs end FAILED, or KILLED (Ctrl-C, a signal)
        raise
    finally:
        evaluators.close()
        writer.close(status)
    return evaluated


# A step Orbax committed whose manifest is not written yet (its trainer writes it right after, taking
# longer the larger the step) is looked at again while a live trainer holds the model directory, every
# MANIFEST_POLL_SECONDS (at most poll_seconds), for up to MANIFEST_WAIT_SECONDS; then it is skipped with
# one warning like a damaged step. Without a live trainer the manifest can never come: skipped at once.
MANIFEST_WAIT_SECONDS = 300.0
MANIFEST_POLL_SECONDS = 1.0


def _watch(model_dir: str, output_dir: str, *, step: int | None, every_checkpoint: bool, wait_seconds: float,
           poll_seconds: float, final_step: int | None, manifest_wait_seconds: float = MANIFEST_WAIT_SECONDS,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
           ) -> Iterator[int]:
    """Yields the steps to evaluate, then (with wait_seconds) new ones as they appear.

    Each step's bytes are checked once (manifest.py), except a step whose manifest is still due
    (see MANIFEST_WAIT_SECONDS): it is looked at again at each poll, and the loop does not end
    while one is awaited. `clock` and `sleep` are time.monotonic and time.sleep but in tests.
    """
    last_new = clock()
    states: dict[int, Any] = {}  # each step's final state (manifest.StepState)
    awaited: dict[int, float] = {}  # steps whose manifest is due -> when first seen without it
    while True:
        checkpointer = checkpoint.Checkpointer(model_dir, read_only=True)
        try:
            available = checkpointer.all_steps()
            done = {s for s in available if storage.exists(result_path(output_dir, s))}
            found = {s: checkpointer.check(s) for s in available
                     if s not in done and s not in states and (step is None or s == step)}
        finally:
            checkpointer.close()
        awaited = {s: since for s, since in awaited.items() if s in found}  # gone: deleted by retention
        writer_live: bool | None = None
        for s, state in sorted(found.items()):
            if state.manifest_due:
                since = awaited.setdefault(s, clock())
                writer_live = _writer_live(model_dir) if writer_live is None else writer_live
                if writer_live and clock() - since < manifest_wait_seconds:
                    continue
                if writer_live:
                    state = dataclasses.replace(state, reason="its trainer is running but wrote no manifest.json "
                                                              f"in {clock() - since:.0f} s")
            awaited.pop(s, None)
            states[s] = state
            if not state.readable and step is None:
                _say(f"WARNING: skipping the checkpoint at {state.describe()}")
        if step is not None and step in states and not states[step].readable:
            raise lookup.DamagedCheckpointError(
                f"the checkpoint at {states[step].describe()} in {checkpoint.checkpoints_dir(model_dir)}; "
                "name another step (`t5x-lite checkpoint verify MODEL_DIR` lists each step's state).")
        ready = [s for s in available if s not in awaited and (s not in states or states[s].readable)]
        watching = every_checkpoint or wait_seconds > 0
        # While a manifest is awaited, a named step or "the latest" is chosen once it is known.
        todo = [] if awaited and (step is not None or not watching) else steps_to_evaluate(
            ready, done, step=step, every_checkpoint=watching)
        for chosen in todo:
            yield chosen
            last_new = clock()
            if final_step is not None and chosen >= final_step:
                for s in sorted(awaited):
                    _say(f"WARNING: not evaluating the checkpoint at step {s}: its manifest was still not written "
                         f"when step {chosen} (evaluate.final_step) was evaluated")
                return
        if awaited:
            sleep(min(poll_seconds, MANIFEST_POLL_SECONDS))
        elif step is not None or wait_seconds <= 0 or clock() - last_new > wait_seconds:
            return
        else:
            sleep(poll_seconds)


def _writer_live(model_dir: str) -> bool:
    """Whether a live trainer holds `model_dir` (so a manifest that is due may still be written)."""
    try:
        return lease.live_holder(model_dir) is not None
    except Exception:  # noqa: BLE001 - a lease that cannot be read: assume a writer, the wait is bounded
        return True


class _Evaluators:
    """The configured evaluations, built once (seqio caches its splits) and run per checkpoint."""

    def __init__(self, *, perplexity: PerplexityEval | None, multiple_choice: Sequence[MultipleChoiceEval],
                 seqio_evals: Sequence[SeqioEval], output_dir: str):
        self.perplexity = perplexity
        self.documents, self.documents_bos = _documents(perplexity) if perplexity else (None, 0)
        self.multiple_choice = list(multiple_choice)
        for mc in self.multiple_choice:
            multiple_choice_lib.read_hellaswag(mc.path)  # a missing or malformed file fails before any checkpoint is read
        self.seqio = []
        if seqio_evals:
            self.seqio = [seqio_metrics.SeqioEvaluation(
                mixture_or_task_name=s.mixture_or_task_name, split=s.split, num_examples=s.num_examples,
                batch_size=s.batch_size, decoding_config=s.decoding, log_dir=storage.join(output_dir, "seqio"))
                for s in seqio_evals]

    def run(self, restored: restored_model.RestoredModel) -> dict[str, Any]:
        results: dict[str, Any] = {"step": restored.step}
        cfg = restored.config
        if self.perplexity:
            _require_decoder("perplexity", cfg)
            context = self.perplexity.context_length or cfg.max_len
            stride = self.perplexity.stride or max(1, context // 2)
            results["perplexity"] = perplexity_eval.perplexity(
                model=cfg, params=restored.params, documents=self.documents, context_length=min(context, cfg.max_len),
                stride=stride, batch_size=self.perplexity.batch_size, placement=restored.placement,
                bos_id=self.documents_bos)
            r = results["perplexity"]
            _say(f"step {restored.step}: {self.perplexity.mixture_or_task_name} {self.perplexity.split} perplexity "
                   f"{r['perplexity']:.3f} (loss {r['loss']:.4f} over {int(r['tokens'])} tokens, context {context}, "
                   f"stride {stride})")
        for mc in self.multiple_choice:
            _require_decoder("multiple-choice scoring", cfg)
            vocabulary = restored.vocabulary()
            results[mc.name] = score_multiple_choice_set(mc, model=cfg, params=restored.params,
                                                         encode=lambda t: list(vocabulary.encode(t)),
                                                         placement=restored.placement,
                                                         bos_id=tokenizer_files.decoder_start_id(vocabulary))
            r = results[mc.name]
            _say(f"step {restored.step}: {mc.name} acc {r['acc']:.4f}, acc_norm {r['acc_norm']:.4f} "
                   f"({int(r['examples'])} examples)")
        for evaluation_ in self.seqio:
            for task, values in evaluation_.run(restored).items():
                results.setdefault("seqio", {})[task] = values
                _say(f"step {restored.step}: {task} " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
        return results

    def close(self) -> None:
        for evaluation_ in self.seqio:
            evaluation_.close()


def _report_share(restored: restored_model.RestoredModel) -> None:
    """With several processes, each says how many rows it computed (about 1/N of them each)."""
    placement = restored.placement
    if jax.process_count() > 1:
        print(f"process {jax.process_index()}: step {restored.step}: computed {placement.rows_computed} rows "
              f"in {placement.batches_run} batches on {placement.describe()}", flush=True)


def _say(message: str) -> None:
    """Results are printed (by process 0) even when TensorBoard is off (output on object storage)."""
    if distributed.is_chief():
        print(message, flush=True)


def _require_decoder(what: str, model: BaseModel) -> None:
    if not model.continues_text:
        raise ConfigValueError(f"{what} scores decoder-only language models; this checkpoint holds a "
                               f"{model.family} model (use seqio_evals with a score metric instead).")


def _documents(cfg: PerplexityEval) -> tuple[list[list[int]], int]:
    """The split's `targets` token ids, one list per document, in order; and the first token a
    decoder-only model reads before them (its vocabulary's decoder start: data/vocab/tokenizer_files.py)."""

    documents = task_access.split_documents(cfg.mixture_or_task_name, cfg.split, max_tokens=cfg.max_document_tokens,
                                            limit=cfg.max_documents)
    if not any(documents):
        raise TaskDataError(f"The {cfg.split} split of {cfg.mixture_or_task_name!r} is empty; nothing to score.")
    return documents, tokenizer_files.decoder_start_id(task_access.task_vocabulary(cfg.mixture_or_task_name))


def score_multiple_choice_set(mc: MultipleChoiceEval, *, model: BaseModel, params: Any,
                              encode: Callable[[str], list[int]], placement: Placement | None = None,
                              bos_id: int = 0) -> dict[str, float]:
    """acc / acc_norm of one multiple-choice set with these params (also run during training); `bos_id`:
    the model's first token (data/vocab/tokenizer_files.py `decoder_start_id` of the vocabulary `encode` uses)."""
    examples = multiple_choice_lib.read_hellaswag(mc.path)[:mc.max_examples]
    return multiple_choice_lib.score_multiple_choice(model=model, params=params, examples=examples, encode=encode,
                                                     batch_size=mc.batch_size, placement=placement, bos_id=bos_id)


def _write_results(output_dir: str, step: int, results: dict[str, Any]) -> None:
    """step_<N>.json, whole or not at all."""
    storage.makedirs(output_dir)
    storage.write_whole(result_path(output_dir, step), json.dumps(results, indent=2, sort_keys=True))


def _scalar_groups(results: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """(TensorBoard folder, scalars) pairs of a step's results."""
    groups = []
    for name, values in results.items():
        if name == "seqio":
            groups += [(f"seqio_{task}", task_values) for task, task_values in values.items()]
        elif isinstance(values, dict):
            groups.append((name, {k: v for k, v in values.items() if isinstance(v, (int, float))}))
    return groups
