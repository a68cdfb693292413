"""Token-budget arms in dataset runs (``hf:keep=K,policy=P``) and the sweep's curve, on the trained
demo checkpoint: keep=100 is the plain arm exactly; a budget arm answers what the engine answers on
the reduced request; the curve's numbers are recomputed here from the runs' own rows."""

import json
import math

import numpy as np
import pytest

from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, run_eval
from g4v.evaluate.budget import CURVE_FILE, curve_table, parse_keeps, parse_policies, run_budget_sweep
from g4v.evaluate.stats import wilson_interval
from g4v.paths import TRAINED_MODEL_DIR
from tests.cli import run_cli

ROWS = 4


@pytest.fixture(scope="module")
def trained_engine():
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


def config(b: str, **more) -> EvalConfig:
    return EvalConfig(a=ArmSpec("hf"), b=ArmSpec.parse(b), data=str(BUNDLED_DATASET), limit=ROWS,
                      max_new_tokens=4, **more)


def test_budget_arms_parse():
    spec = ArmSpec.parse("hf:keep=50,policy=attention")
    assert (spec.keep, spec.policy, spec.budget.keep, spec.budget.policy) == (50, "attention", 50, "attention")
    assert ArmSpec.parse("hf:keep=25").budget.policy == "norm"
    assert ArmSpec.parse("hf:keep=25,policy=random").display == "hf[keep 25% random]"
    assert ArmSpec.parse("hf").budget is None
    assert ArmSpec.parse("hf:keep=50").engine_key() == ArmSpec.parse("hf").engine_key()  # one engine for both


@pytest.mark.parametrize("text, message", [
    ("vllm:keep=50", "runs on hf arms only"),
    ("openai:http://h:1/v1,keep=50", "runs on hf arms only"),
    ("hf:policy=random", "policy= needs keep=K"),
    ("hf:keep=0", "keep must be a whole percentage from 1 to 100"),
    ("hf:keep=half", "keep must be a whole percentage from 1 to 100"),
    ("hf:keep=50,policy=fastv", "token policy must be one of norm, attention, attribution, random"),
])
def test_bad_budget_arms_are_one_line(text, message):
    with pytest.raises(G4VError, match=message) as caught:
        ArmSpec.parse(text)
    assert "\n" not in str(caught.value)


def test_sweep_lists_are_checked():
    assert parse_keeps("10, 100,50,50") == (100, 50, 10)
    assert parse_policies("random,norm") == ("norm", "random")
    assert parse_policies("all") == ("norm", "attention", "attribution", "random")
    for bad in ("", "100,", "0", "75.5", "101"):
        with pytest.raises(G4VError):
            parse_keeps(bad)
    with pytest.raises(G4VError, match="token policy must be one of"):
        parse_policies("norm,fastv")


def test_keep_100_equals_the_plain_arm_exactly(trained_engine, tmp_path):
    result = run_eval(config("hf:keep=100,policy=attribution"), tmp_path, reuse={ArmSpec("hf"): trained_engine})
    assert len(result.rows) == ROWS and result.summary.agreement == 1.0
    for row in result.rows:
        assert row.answer_a == row.answer_b and row.kl_mean == 0.0 and row.kl_max == 0.0
        assert row.logprob_a_under_b == row.logprob_b_under_a  # the same logits, bit for bit


def test_a_budget_arm_answers_as_the_engine_on_the_reduced_request(trained_engine, tmp_path):
    from g4v.conversation import Message, SamplingSettings
    from g4v.evaluate import open_dataset
    from g4v.model.token_budget import TokenBudget, reduce_request

    result = run_eval(config("hf:keep=10,policy=norm", batch_size=3), tmp_path, reuse={ArmSpec("hf"): trained_engine})
    dataset = open_dataset(str(BUNDLED_DATASET))
    settings = SamplingSettings(max_new_tokens=4, temperature=0.0)
    for row in result.rows:
        sample = dataset.sample(row.index)
        full = trained_engine.prepare([Message("user", sample.prompt, list(sample.images))])
        reduced = reduce_request(trained_engine, full, TokenBudget(10, "norm"))
        assert row.answer_b == trained_engine.generate(reduced, settings).text
        assert row.answer_a == trained_engine.generate(full, settings).text
    assert all(row.kl_mean is not None for row in result.rows)
    assert any(row.kl_mean > 0 for row in result.rows)  # a tenth of the picture changes the distribution


def test_sweep_curve_is_the_runs_numbers(trained_engine, tmp_path):
    reports = []
    curve = run_budget_sweep(config("hf"), tmp_path, "100,25", "norm,random", reuse={ArmSpec("hf"): trained_engine},
                             progress=lambda done, total: reports.append((done, total)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [CURVE_FILE, "keep100", "norm-keep25", "random-keep25"]
    assert reports[-1] == (3 * ROWS, 3 * ROWS)
    written = json.loads((tmp_path / CURVE_FILE).read_text())
    assert written == json.loads(json.dumps(curve.to_dict()))
    assert [(p.policy, p.keep) for p in curve.points] == [("norm", 100), ("norm", 25), ("random", 100), ("random", 25)]
    for point in curve.points:
        rows = [json.loads(line) for line in (tmp_path / point.run / "samples.jsonl").read_text().splitlines()]
        right = sum(row["correct_b"] for row in rows)
        assert point.n == len(rows) == ROWS
        assert point.accuracy == right / ROWS and point.ci95 == wilson_interval(right, ROWS)
        kls = np.array([row["kl_mean"] for row in rows])
        half = 1.959963984540054 * kls.std(ddof=1) / math.sqrt(len(kls))
        assert point.kl_mean == pytest.approx(kls.mean(), abs=1e-12)
        assert point.kl_ci95 == pytest.approx([max(0.0, kls.mean() - half), kls.mean() + half], abs=1e-12)
    assert curve.points[0].kl_mean == 0.0 and curve.points[0].accuracy == curve.points[2].accuracy


def test_budget_figure_draws_the_curve_and_says_when_empty():
    from viz.token_budget import budget_figure

    point = {"policy": "norm", "keep": 50, "n": 4, "accuracy": 0.5, "ci95": [0.15, 0.85], "agreement": 0.5,
             "kl_mean": 0.2, "kl_ci95": [0.0, 0.5], "run": "norm-keep50"}
    picture = budget_figure({"arm": "hf", "keeps": [100, 50], "policies": ["norm", "random"],
                             "points": [point, {**point, "policy": "random", "accuracy": None, "ci95": None}]})
    assert 800 <= picture.width <= 2400 and picture.height <= 2400
    empty = budget_figure({"arm": "hf", "keeps": [50], "policies": ["norm"], "points": []})
    assert empty.height < picture.height


def test_sweep_header_names_the_arm_with_a_space():
    curve = {"arm": "hf(granite4-vision-tiny-trained)[keep 50% norm]", "points": []}
    assert curve_table(curve).splitlines()[0] == "token budget of hf (granite4-vision-tiny-trained)[keep 50% norm]"
    assert curve_table({"arm": "openai@host:8000", "points": []}).splitlines()[0] == "token budget of openai@host:8000"


def test_cli_sweep_writes_the_curve_and_refuses_bad_input_in_one_line(tmp_path):
    out = tmp_path / "sweep"
    result = run_cli("eval", "--a", "hf", "--data", str(BUNDLED_DATASET), "--out", str(out),
                     "--limit", "2", "--max-new-tokens", "2", "--keep-sweep", "100,10", "--policy", "random")
    assert result.returncode == 0, result.stderr
    assert "random" in result.stdout and (out / "budget.png").is_file() and (out / CURVE_FILE).is_file()
    for argv, message in (
            (["--keep-sweep", "0"], "keep must be a whole percentage from 1 to 100"),
            (["--keep-sweep", "50", "--policy", "fastv"], "token policy must be one of"),
            ([], "give the second arm with --b ARM")):
        result = run_cli("eval", "--a", "hf", "--data", str(BUNDLED_DATASET), "--out", str(tmp_path / "x"), *argv)
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_the_tab_offers_half_budget_arms_of_the_apps_model(trained_engine):
    from webapp.evaluate_choices import arm_choices

    keys = {choice.key: choice.spec for choice in arm_choices(trained_engine, str(TRAINED_MODEL_DIR))}
    for policy in ("norm", "attention", "attribution", "random"):
        spec = keys[f"app:keep=50,policy={policy}"]
        assert (spec.backend, spec.keep, spec.policy, spec.model) == ("hf", 50, policy, str(TRAINED_MODEL_DIR))
        assert spec.engine_key() == keys["app"].engine_key()  # the app's own engine, no second load
