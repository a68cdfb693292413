"""Dataset-run statistics against independent computations (scipy), and the summary on hand-made rows.

No model: these run in well under a second.
"""

from dataclasses import asdict

import numpy as np
import pytest
from scipy.stats import binomtest

from g4v.errors import G4VError
from g4v.evaluate import ArmSpec, Columns, SampleResult, mcnemar_exact, normalise, summarise, wilson_interval
from g4v.evaluate.stats import quantile
from g4v.evaluate.summary import BlankSame, Block


@pytest.mark.parametrize("k,n", [(0, 1), (0, 10), (3, 10), (10, 10), (37, 50), (299, 300), (1, 1000)])
def test_wilson_interval_matches_scipy(k, n):
    expected = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(expected.low, abs=1e-12)
    assert high == pytest.approx(expected.high, abs=1e-12)


def test_wilson_interval_without_rows_is_none():
    assert wilson_interval(0, 0) is None


@pytest.mark.parametrize("a_only,b_only", [(0, 0), (0, 1), (1, 0), (0, 5), (3, 7), (12, 12), (2, 40), (25, 3)])
def test_mcnemar_exact_matches_a_two_sided_binomial_test(a_only, b_only):
    expected = 1.0 if a_only + b_only == 0 else binomtest(a_only, a_only + b_only, 0.5).pvalue
    assert mcnemar_exact(a_only, b_only) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_hand_enumerated_case():
    # 0 vs 5 discordant pairs: both one-sided extremes have probability 1/32 each.
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(1, 4) == pytest.approx(2 * (1 + 5) / 32)


@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 0.99, 1.0])
def test_quantile_matches_numpy(q):
    values = [0.3, 2.0, 0.0, 7.5, 1.25, 0.01, 4.0]
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


@pytest.mark.parametrize("text,expected", [(" The  Star. ", "the star"), ("RED!", "red"), ("one", "one"),
                                           ("a\tb\n", "a b"), ("", ""), ("left ?", "left")])
def test_normalise(text, expected):
    assert normalise(text) == expected


def row(index, category, correct_a, correct_b, agree=True, kl=None, error=None, blank_a=None):
    return SampleResult(
        index=index, sample_id=str(index), category=category, prompt="p", reference="r",
        answer_a="x", answer_b="x" if agree else "y", correct_a=correct_a, correct_b=correct_b,
        exact_a=correct_a, exact_b=correct_b, agree=agree, first_divergence=None if agree else 0,
        logprob_a_under_b=None, logprob_b_under_a=None,
        kl_mean=kl, kl_q90=kl, kl_q99=kl, kl_max=None if kl is None else 2 * kl,
        image_tokens=10, blank_same_a=blank_a, blank_same_b=None, level_norms_a=None, level_norms_b=None,
        error=error)


def test_summarise_hand_made_rows():
    rows = [
        row(0, "colour", True, False, agree=False, kl=1.0),
        row(1, "colour", True, False, agree=False, kl=3.0),
        row(2, "colour", True, True, kl=0.5, blank_a=True),
        row(3, "shape", True, True, kl=0.0, blank_a=False),
        row(4, "shape", False, False, kl=0.0),
        row(5, "shape", False, True, agree=False, kl=0.2),
        row(6, "shape", None, None, error="image not found: 'x.png'"),
    ]
    summary = summarise(rows, "base", "tuned")
    assert summary.n == 7 and summary.n_errors == 1 and summary.complete is True
    assert summary.arms.a.label == "base" and summary.arms.b.label == "tuned"
    assert summary.arms.a.accuracy == pytest.approx(4 / 6)
    assert summary.arms.b.accuracy == pytest.approx(3 / 6)
    assert summary.arms.a.ci95 == pytest.approx(wilson_interval(4, 6))
    assert asdict(summary.paired) == {"both_right": 2, "a_only": 2, "b_only": 1, "both_wrong": 1,
                                      "mcnemar_p": pytest.approx(binomtest(2, 3, 0.5).pvalue)}
    assert summary.agreement == pytest.approx(3 / 6)
    kls = [1.0, 3.0, 0.5, 0.0, 0.0, 0.2]
    assert summary.kl.mean == pytest.approx(np.mean(kls))
    assert summary.kl.q90 == pytest.approx(np.quantile(kls, 0.9))
    assert summary.kl.max == pytest.approx(6.0)
    assert summary.blank_same == BlankSame(a=0.5, b=None)
    colour, shape = summary.by_category["colour"], summary.by_category["shape"]
    assert colour.agreement == pytest.approx(1 / 3) and shape.agreement == pytest.approx(2 / 3)
    assert colour.paired.a_only == 2 and shape.paired.b_only == 1
    assert shape.n == 4 and shape.n_errors == 1
    assert type(colour) is Block and type(shape) is Block  # no categories or worst rows of its own
    # errors first, then split disagreements by KL (row 1 before 0 before 5), then agreeing rows by KL
    assert summary.worst[:4] == [6, 1, 0, 5]
    assert summary.worst[4] == 2


def test_summarise_without_references_gives_no_accuracy():
    rows = [row(0, None, None, None), row(1, None, None, None, agree=False)]
    summary = summarise(rows, "a", "b", complete=False)
    assert summary.arms.a.accuracy is None and summary.arms.a.ci95 is None
    assert summary.paired.mcnemar_p == 1.0 and summary.agreement == 0.5
    assert summary.by_category == {} and summary.complete is False and summary.kl is None


@pytest.mark.parametrize("text,expected", [
    ("hf", ArmSpec("hf")),
    ("hf:adapter=tiny-trained-french", ArmSpec("hf", adapter="tiny-trained-french")),
    ("hf:model=assets/granite4-vision-tiny", ArmSpec("hf", model="assets/granite4-vision-tiny")),
    ("vllm:adapter=x,label=port", ArmSpec("vllm", adapter="x", label="port")),
    ("openai:http://10.0.0.2:8000/v1,model=granite,adapter=fr",
     ArmSpec("openai", model="granite", adapter="fr", base_url="http://10.0.0.2:8000/v1")),
])
def test_arm_parse(text, expected):
    assert ArmSpec.parse(text) == expected


def test_arm_display():
    assert ArmSpec("hf").display == "hf"
    assert ArmSpec("hf", adapter="demo-french").display == "hf+demo-french"
    assert ArmSpec.parse("openai:http://host:8000/v1").display == "openai@host:8000"
    assert ArmSpec("vllm", label="mine").display == "mine"


@pytest.mark.parametrize("text", ["", "torch", "hf:adapter", "hf:colour=red", "openai", "openai:model=x",
                                  "vllm:adapter="])
def test_bad_arm_text_is_one_line(text):
    with pytest.raises(G4VError) as err:
        ArmSpec.parse(text)
    assert "\n" not in str(err.value) and "arm" in str(err.value)


def test_columns_parse():
    assert Columns.parse("image=img,prompt=question,reference=answer,category=kind") == Columns(
        image="img", prompt="question", reference="answer", category="kind")
    assert Columns.parse(None) == Columns()
    for bad in ("picture=img", "image", "image="):
        with pytest.raises(G4VError):
            Columns.parse(bad)



def test_summary_json_round_trips_through_the_types():
    """``summary.json`` (``to_dict``) read back (``from_dict``) is the same summary, every part
    present: per-field scores, the noise floor and a precision pair's per-level drift."""
    import json

    from g4v.evaluate.summary import LevelDrift, RunSummary
    from g4v.model.precision import drift_summary

    truth = json.dumps({"total": "5", "date": "d1"})
    rows = [row(0, "kvp", True, False, agree=False, kl=1.0), row(1, "colour", True, True, kl=0.5, blank_a=True),
            row(2, None, None, None, error="image not found: 'x.png'")]
    rows[0].reference, rows[0].answer_a, rows[0].answer_b = truth, truth, '{"total": "6"}'
    summary = summarise(rows, "a", "a again", same_arm=True)
    drift = drift_summary([{"levels": {"deepstack0": {"rel_error": 0.01, "cosine": 0.999}}, "next_token_kl": 0.002}])
    summary.level_drift = LevelDrift(**vars(drift), of="hf[bfloat16]", against="hf")
    values = json.loads(json.dumps(summary.to_dict()))
    assert list(values) == ["n", "n_errors", "arms", "paired", "equivalence", "agreement", "kl", "blank_same",
                            "complete", "by_category", "worst", "detectable", "noise_floor", "fields", "level_drift"]
    assert list(values["level_drift"]) == ["of", "against", "n", "levels", "next_token_kl_mean"]
    assert values["fields"]["fields"]["$.total"]["b"]["wrong"] == 1 and values["noise_floor"]["discordant"] == 1
    again = RunSummary.from_dict(values)
    assert again == summary and again.to_dict() == values
    without = {key: value for key, value in values.items() if key != "level_drift"}
    assert RunSummary.from_dict(without).level_drift is None and "level_drift" not in RunSummary.from_dict(without).to_dict()
