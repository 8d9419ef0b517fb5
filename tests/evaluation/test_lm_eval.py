"""lm-evaluation-harness's model `t5x_lite` (evaluation/lm_eval_model.py) and `t5x-lite lm-eval`.

A local multiple-choice task (a YAML file over a jsonl, both written here) scored through lm-eval
gives the project's own multiple-choice accuracy; loglikelihood_rolling gives the strided-perplexity
evaluator's log-likelihood; generate_until stops at its until-strings and after max_gen_toks; the
same for a T5. Nothing is downloaded: the datasets come from local files, offline.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import pytest

from t5x_lite.evaluation import multiple_choice
from t5x_lite.evaluation import perplexity as perplexity_eval
from t5x_lite.inference import predict
from t5x_lite.models import T5Config
from tests.cli_helpers import VOCAB, run_cli
from tests.evaluation.model_dirs import random_decoder_dir, save_model_dir

TASK = "t5x_lite_test_choices"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
os.environ.update(OFFLINE)  # at collection, before lm_eval imports `datasets`: nothing is downloaded

# ASCII only: lm-eval's acc_norm divides by characters, the project's scorer's by UTF-8 bytes (as
# lm-eval's acc_bytes does). The labels are such that the random model of `decoder_dir` gets some
# right, but not all.
ITEMS = [
    ("def add(a, b):", ["return a + b", "pass", "import os", "while True: break"], 0),
    ("import", ["os", "sys as system", "json", "re"], 3),
    ("class Point:", ["def __init__(self, x, y):", "pass", "x = 1"], 2),
    ("for i in range(10):", ["print(i)", "continue", "total += i * i"], 1),
    ("with open(path) as f:", ["data = f.read()", "pass", "return None"], 1),
    ("if x is None:", ["raise ValueError('x')", "return", "x = []"], 2),
    ("try:", ["import json", "pass", "value = compute()"], 0),
    ("def __repr__(self):", ["return f'{self.x}'", "return 'P'", "pass"], 1),
    ("while queue:", ["item = queue.pop()", "break", "queue.clear()"], 2),
    ("lines = text.split", ["('\\n')", "()", "(sep)"], 0),
]
DOCUMENTS = ["def parse(text):\n    return json.loads(text)\n" * 6,
             "import os\nimport sys\n\nclass Reader:\n    def __init__(self, path):\n        self.path = path\n" * 4,
             "x = 1"]


def _request(kind: str, *args):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory, data_dir):
    return random_decoder_dir(tmp_path_factory.mktemp("lm_eval_decoder") / "run", data_dir)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory, data_dir):
    cfg = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                   num_decoder_layers=2)
    zeros = jnp.zeros((1, 8), jnp.int32)
    params = cfg.make_module().init(jax.random.PRNGKey(4), encoder_input_tokens=zeros,
                                    decoder_input_tokens=zeros)["params"]
    return save_model_dir(tmp_path_factory.mktemp("lm_eval_t5") / "run", cfg, {7: params}, data_dir)


@pytest.fixture(scope="module")
def decoder_lm(decoder_dir):
    from t5x_lite.evaluation.lm_eval_model import T5xLiteLM

    return T5xLiteLM(model_dir=str(decoder_dir), batch_size="4", max_gen_toks="24")


@pytest.fixture(scope="module")
def t5_lm(t5_dir):
    from t5x_lite.evaluation.lm_eval_model import T5xLiteLM

    return T5xLiteLM.create_from_arg_string(f"model_dir={t5_dir},step=7,max_gen_toks=12", {"batch_size": 3})


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A local lm-eval multiple-choice task over a jsonl of ITEMS."""
    folder = tmp_path_factory.mktemp("lm_eval_task")
    items = folder / "items.jsonl"
    items.write_text("".join(json.dumps({"context": c, "endings": e, "label": y}) + "\n" for c, e, y in ITEMS))
    (folder / f"{TASK}.yaml").write_text(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
  cache_dir: {folder / "hf_cache"}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: endings
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
  - metric: acc_bytes
    aggregation: mean
    higher_is_better: true
""")
    return folder


@pytest.fixture(scope="module")
def expected_accuracy(decoder_lm):
    """The project's own multiple-choice scorer on ITEMS."""
    examples = [multiple_choice.MultipleChoiceExample(context=c, endings=e, label=y) for c, e, y in ITEMS]
    return multiple_choice.score_multiple_choice(
        model=decoder_lm.config, params=decoder_lm.params, examples=examples, encode=decoder_lm.vocabulary.encode,
        batch_size=4, placement=decoder_lm.placement)


# --- Through lm-eval ------------------------------------------------------------------------------

def test_simple_evaluate_gives_the_projects_multiple_choice_accuracy(decoder_dir, task_dir, expected_accuracy,
                                                                    decoder_lm):
    import lm_eval
    import lm_eval.tasks

    import t5x_lite.evaluation.lm_eval_model  # noqa: F401 (registers `t5x_lite`)

    results = lm_eval.simple_evaluate(
        model="t5x_lite", model_args=f"model_dir={decoder_dir},batch_size=4", tasks=[TASK], log_samples=True,
        task_manager=lm_eval.tasks.TaskManager(include_path=str(task_dir), include_defaults=False))
    metrics = results["results"][TASK]
    assert metrics["acc,none"] == pytest.approx(expected_accuracy["acc"])
    assert metrics["acc_norm,none"] == pytest.approx(expected_accuracy["acc_norm"])
    assert metrics["acc_bytes,none"] == pytest.approx(expected_accuracy["acc_norm"])  # bytes: on any text
    assert 0 < expected_accuracy["acc"] < expected_accuracy["acc_norm"] < 1
    # Each choice's log-likelihood is the project's: context and " " + ending encoded apart.
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    pairs = [(decoder_lm.encode(c), decoder_lm.encode(" " + e)) for c, endings, _ in ITEMS for e in endings]
    ours = decoder_lm.loglikelihood_tokens(pairs)
    theirs = [tuple(r) for s in samples for r in s["filtered_resps"]]
    assert [ll for ll, _ in theirs] == pytest.approx([ll for ll, _ in ours], rel=1e-6)


def test_the_cli_wrapper_runs_lm_eval_with_the_t5x_lite_model(decoder_dir, task_dir, expected_accuracy, tmp_path):
    result = run_cli("lm-eval", "--model_args", f"model_dir={decoder_dir}", "--tasks", TASK,
                     "--include_path", str(task_dir), "--output_path", str(tmp_path / "out"), extra_env=OFFLINE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "t5x_lite" in result.stdout and TASK in result.stdout
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    metrics = json.loads(results_file.read_text())["results"][TASK]
    assert metrics["acc,none"] == pytest.approx(expected_accuracy["acc"])
    assert metrics["acc_norm,none"] == pytest.approx(expected_accuracy["acc_norm"])


@pytest.mark.parametrize("model_args, message", [
    (None, "needs a model directory: --model_args model_dir=DIR"),
    ("model_dir={dir},step=999", "no checkpoint at step 999 in"),
    ("model_dir={dir},step=soon", "model_args step='soon' must be an integer"),
    ("model_dir={dir},batch=4", "unknown model_args batch of the t5x_lite model"),
    ("model_dir={missing}", "missing"),
])
def test_the_cli_wrapper_reports_bad_model_args_in_one_line(decoder_dir, tmp_path, capsys, model_args, message):
    from t5x_lite.evaluation import lm_eval_command

    argv = ["--tasks", TASK]
    if model_args:
        argv += ["--model_args", model_args.format(dir=decoder_dir, missing=tmp_path / "missing")]
    with pytest.raises(SystemExit) as exit_info:
        lm_eval_command.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_the_cli_wrapper_without_lm_eval_names_the_install(monkeypatch, capsys):
    from t5x_lite.evaluation import lm_eval_command

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "lm_eval._cli", None)
    with pytest.raises(SystemExit) as exit_info:
        lm_eval_command.main(["--model_args", "model_dir=x", "--tasks", TASK])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: lm-evaluation-harness is not installed: run `make "
                                               "install-tracking` (the pinned lm_eval and its dependencies, "
                                               "requirements/tracking.txt).")


def test_lm_eval_argv_adds_the_model_and_batch_size_only_when_missing():
    from t5x_lite.evaluation.lm_eval_command import lm_eval_argv

    assert lm_eval_argv(["--tasks", "t"], batch_size=8) == ["run", "--tasks", "t", "--model", "t5x_lite",
                                                           "--batch_size", "8"]
    assert lm_eval_argv(["run", "--model=hf", "-b", "2"], batch_size=8) == ["run", "--model=hf", "-b", "2"]
    assert lm_eval_argv(["ls", "tasks"], batch_size=8) == ["ls", "tasks"]


# --- The request types, decoder-only --------------------------------------------------------------

def test_loglikelihood_rolling_is_the_strided_perplexity_log_likelihood(decoder_lm):
    documents = [decoder_lm.encode(text) for text in DOCUMENTS]
    assert len(documents[0]) > 2 * decoder_lm.config.max_len  # several windows
    rolling = decoder_lm.loglikelihood_rolling([_request("loglikelihood_rolling", text) for text in DOCUMENTS])
    max_len = decoder_lm.config.max_len
    for total, document in zip(rolling, documents):
        result = perplexity_eval.perplexity(model=decoder_lm.config, params=decoder_lm.params, documents=[document],
                                            context_length=max_len, stride=max_len, batch_size=4,
                                            placement=decoder_lm.placement)
        assert result["tokens"] == len(document)
        assert total == pytest.approx(-result["loss"] * result["tokens"], rel=1e-5)
    assert decoder_lm.loglikelihood_rolling([_request("loglikelihood_rolling", "")]) == [0.0]


def test_loglikelihood_flags_only_the_greedy_continuation(decoder_lm):
    context = decoder_lm.encode("def f(x):")
    greedy = decoder_lm._generate([decoder_lm.fit_prompt(context, 6)], predict.DecodingConfig(max_decode_length=6))[0]
    other = (greedy[-1] % (VOCAB - 3)) + 2
    results = decoder_lm.loglikelihood_tokens([(context, greedy), (context, greedy[:-1] + [other]), (context, [])])
    assert [g for _, g in results] == [True, False, True]
    assert results[0][0] > results[1][0] and results[2][0] == 0.0


def _stop_inside(text: str) -> tuple[str, str]:
    """A piece of `text` from its middle, and `text` up to that piece's first occurrence."""
    stop = text[len(text) // 2:len(text) // 2 + 2]
    return stop, text[:text.index(stop)]


@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
def test_generate_until_stops_before_the_until_strings_and_after_max_gen_toks(family, decoder_lm, t5_lm):
    lm = decoder_lm if family == "decoder_only" else t5_lm
    prompts = ["def f(x):", "import os", "class A", ""]
    # The greedy output, uncut (8 tokens: T5's greedy flags above decode as many, one compile).
    free = lm.generate_until([_request("generate_until", p, {"until": [], "max_gen_toks": 8}) for p in prompts])
    assert all(len(text) >= 4 for text in free), free
    stops, expected = zip(*(_stop_inside(text) for text in free))
    cut = lm.generate_until([_request("generate_until", p, {"until": [s, "\x00never"], "max_gen_toks": 8})
                             for p, s in zip(prompts, stops)])
    assert list(cut) == list(expected)
    assert not any(s in text for s, text in zip(stops, cut))
    assert lm.generate_until([_request("generate_until", prompts[0], {"until": stops[0], "max_gen_toks": 8})]) \
        == [expected[0]]
    # max_gen_toks: the first 3 tokens of the greedy output (which stops at EOS).
    tokens = lm._generate([lm.fit_prompt(lm.encode(p), 8) for p in prompts],
                          predict.DecodingConfig(max_decode_length=8))
    assert free == [lm.vocabulary.decode(t) for t in tokens]
    short = lm.generate_until([_request("generate_until", p, {"max_gen_toks": 3}) for p in prompts])
    assert short == [lm.vocabulary.decode(t[:3]) for t in tokens]


def test_generate_until_samples_with_do_sample(decoder_lm):
    request = _request("generate_until", "def ", {"do_sample": True, "temperature": 1.0, "max_gen_toks": 8})
    greedy = decoder_lm.generate_until([_request("generate_until", "def ", {"max_gen_toks": 8})] * 4)
    sampled = decoder_lm.generate_until([request] * 4)
    assert len(set(greedy)) == 1 and len(set(sampled)) > 1


def test_a_long_decoder_prompt_keeps_its_last_tokens(decoder_lm):
    prompt = list(range(2, 200))
    assert decoder_lm.fit_prompt(prompt, 24) == prompt[-(64 - 1 - 24):]
    assert decoder_lm.fit_prompt(prompt, 500) == prompt[-1:]
    text = "x = 1\n" * 80
    (out,) = decoder_lm.generate_until([_request("generate_until", text, {"max_gen_toks": 8})])
    assert isinstance(out, str)


# --- The request types, T5 ------------------------------------------------------------------------

def test_t5_loglikelihood_is_the_continuation_given_the_context_and_eos(t5_lm):
    requests = [("red apple", " fruit"), ("", " empty context"), ("blue sky", " weather is fine")]
    results = t5_lm.loglikelihood([_request("loglikelihood", c, x) for c, x in requests])
    eos = t5_lm.eos_id
    pairs = [(t5_lm.encode(c) + [eos], t5_lm.encode(x)) for c, x in requests]
    expected = predict.score(model=t5_lm.config, params=t5_lm.params, pairs=pairs, batch_size=3)
    assert [ll for ll, _ in results] == pytest.approx(expected, rel=1e-5)
    # is_greedy: true exactly for what greedy decoding produces.
    context = t5_lm.encode("red apple")
    (greedy,) = t5_lm._generate([context + [eos]], predict.DecodingConfig(max_decode_length=8))
    greedy = greedy[:5]
    assert len(greedy) == 5
    other = (greedy[-1] % (VOCAB - 3)) + 2
    flags = [g for _, g in t5_lm.loglikelihood_tokens([(context, greedy), (context, greedy[:3]),
                                                        (context, greedy[:-1] + [other])])]
    assert flags == [True, True, False]


def test_t5_loglikelihood_rolling_scores_the_document_after_an_input_of_eos(t5_lm):
    rolling = t5_lm.loglikelihood_rolling([_request("loglikelihood_rolling", text) for text in DOCUMENTS[1:]])
    pairs = [([t5_lm.eos_id], t5_lm.encode(text)) for text in DOCUMENTS[1:]]
    assert rolling == pytest.approx(predict.score(model=t5_lm.config, params=t5_lm.params, pairs=pairs,
                                                  batch_size=3), rel=1e-5)
