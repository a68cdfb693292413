"""Statistics that can say "no change" (g4v.evaluate.equivalence) and per-field scores
(g4v.evaluate.fields), against independent computations: scipy for the tests and the power, and
hand-counted outcomes for the fields; and a real noise-floor run on the bundled checkpoint."""

import json
import math

import pytest
from scipy import optimize, stats

from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, run_eval
from g4v.evaluate.equivalence import detectable_difference, plan_line, rows_to_detect, score_z, tost_paired
from g4v.evaluate.fields import field_outcomes, field_scores, reference_kind
from g4v.evaluate.run import SampleResult
from g4v.evaluate.stats import detectable, summarise
from webapp.evaluate_equivalence import NO_FIELDS, plan_text, result_values
from tests.cli import run_cli

# (a_only, b_only, n): balanced, none discordant, all discordant, one-sided, large, B better
COUNTS = [(3, 5, 100), (0, 0, 300), (10, 10, 20), (7, 0, 50), (30, 28, 300), (0, 4, 40), (0, 0, 10), (25, 0, 25)]


def reference_z(a_only, b_only, n, delta):
    """The score statistic from the restricted MLE found numerically (scipy), not the closed form:
    maximise the multinomial likelihood over p(B only) = q with p(A only) = q + delta."""
    concordant = n - a_only - b_only

    def minus_loglik(q):
        probabilities = (1 - 2 * q - delta, q + delta, q)
        return -sum(k * math.log(p) for k, p in zip((concordant, a_only, b_only), probabilities) if k)

    low, high = max(0.0, -delta) + 1e-14, (1 - delta) / 2 - 1e-14
    q = optimize.minimize_scalar(minus_loglik, bounds=(low, high), method="bounded", options={"xatol": 1e-14}).x
    return (a_only - b_only - n * delta) / math.sqrt(n * (2 * q + delta - delta ** 2))


@pytest.mark.parametrize("a_only,b_only,n", COUNTS)
@pytest.mark.parametrize("margin", [0.02, 0.1])
def test_tost_equals_scipy(a_only, b_only, n, margin):
    test = tost_paired(a_only, b_only, n, margin=margin)
    p_lower = stats.norm.sf(reference_z(a_only, b_only, n, -margin))
    p_upper = stats.norm.cdf(reference_z(a_only, b_only, n, margin))
    assert test.p_lower == pytest.approx(p_lower, abs=1e-6)
    assert test.p_upper == pytest.approx(p_upper, abs=1e-6)
    assert test.p_value == pytest.approx(max(p_lower, p_upper), abs=1e-6)
    assert test.difference == pytest.approx((a_only - b_only) / n)
    # the 90 % interval: where the scipy statistic crosses ±z(0.95), found by brentq
    z = stats.norm.ppf(0.95)
    d = (a_only - b_only) / n
    low = optimize.brentq(lambda x: reference_z(a_only, b_only, n, x) - z, -1 + 1e-9, d - 1e-12) if d > -1 else -1.0
    high = optimize.brentq(lambda x: reference_z(a_only, b_only, n, x) + z, d + 1e-12, 1 - 1e-9) if d < 1 else 1.0
    assert test.ci == pytest.approx([low, high], abs=1e-6)
    # the verdict is the interval inside the margin, and the p-value below alpha
    assert test.equivalent == (-margin < low and high < margin) == (max(p_lower, p_upper) < 0.05)
    assert test.verdict.startswith("equivalent" if test.equivalent else "not shown equivalent")


def test_tost_edge_cases():
    # no discordant pairs: defined (the Wald error would be 0) and equivalent only with enough rows
    assert not tost_paired(0, 0, 10).equivalent and tost_paired(0, 0, 300).equivalent
    # every pair discordant, half each way: no evidence of equivalence
    everything = tost_paired(10, 10, 20)
    assert not everything.equivalent and everything.ci[0] < -0.02 and everything.ci[1] > 0.02
    # all discordant pairs one way: the difference is 100 points, far outside
    assert tost_paired(25, 0, 25).difference == 1.0 and not tost_paired(25, 0, 25).equivalent
    none = tost_paired(0, 0, 0)
    assert none.p_value is None and not none.equivalent and "nothing to test" in none.verdict
    # swapping the arms mirrors the statistic
    assert score_z(3, 9, 50, 0.05) == pytest.approx(-score_z(9, 3, 50, -0.05))


def scipy_detectable(n, discordance, alpha=0.05, power=0.8):
    """The difference where the normal-approximation power of McNemar's test reaches ``power``."""
    z = stats.norm.ppf(1 - alpha / 2)

    def power_at(delta):
        return stats.norm.cdf((math.sqrt(n) * delta - z * math.sqrt(discordance)) / math.sqrt(discordance - delta ** 2))

    return optimize.brentq(lambda delta: power_at(delta) - power, 1e-12, discordance - 1e-12, xtol=1e-14)


@pytest.mark.parametrize("n,discordance", [(300, 0.1), (24, 0.5), (1000, 0.2), (5000, 0.02), (100, 0.3)])
def test_detectable_difference_equals_scipy(n, discordance):
    assert detectable_difference(n, discordance) == pytest.approx(scipy_detectable(n, discordance), abs=1e-9)


def test_detectable_difference_none_when_no_difference_is_detectable():
    # 100 rows, 5 % discordant: even all 5 discordant rows one way give power under 80 %
    z = stats.norm.ppf(0.975)
    assert stats.norm.cdf((10 * 0.05 - z * math.sqrt(0.05)) / math.sqrt(0.05 - 0.05 ** 2)) < 0.8
    assert detectable_difference(100, 0.05) is None and detectable_difference(0, 0.1) is None


def scipy_power(n, delta, discordance, alpha=0.05):
    """The normal-approximation power of McNemar's test on n rows for a difference delta."""
    z = stats.norm.ppf(1 - alpha / 2)
    return stats.norm.cdf((math.sqrt(n) * delta - z * math.sqrt(discordance)) / math.sqrt(discordance - delta ** 2))


@pytest.mark.parametrize("margin,discordance", [(0.02, 0.1), (0.05, 0.1), (0.1, 0.5), (0.01, 0.02), (0.2, 0.2)])
def test_rows_to_detect_is_the_fewest_rows_with_the_power(margin, discordance):
    needed = rows_to_detect(margin, discordance)
    assert scipy_power(needed, margin, discordance) >= 0.8 - 1e-12 > scipy_power(needed - 1, margin, discordance)
    assert detectable_difference(needed, discordance) <= margin + 1e-9
    assert scipy_detectable(needed, discordance) <= margin + 1e-9


def test_rows_to_detect_none_for_an_impossible_margin():
    assert rows_to_detect(0.2, 0.1) is None and rows_to_detect(0.0, 0.1) is None


def test_the_plan_says_how_many_rows_would_detect_the_margin():
    needed = math.ceil(optimize.brentq(lambda n: scipy_power(n, 0.02, 0.1) - 0.8, 1, 1e7, xtol=1e-9))
    planned = detectable(24, 0.1, margin=0.02)
    assert planned.rows_for_margin == needed
    assert plan_line(planned).endswith(f"none (too few rows for any difference); about {needed} rows would detect ±2 points")
    assert f"about {needed} rows would detect ±2 points." in plan_text(24, 0, 0.1, 0.02)
    wide = math.ceil(optimize.brentq(lambda n: scipy_power(n, 0.05, 0.1) - 0.8, 1, 1e7, xtol=1e-9))
    assert f"about {wide} rows would detect ±5 points" in plan_text(24, 0, 0.1, 0.05)
    # enough rows for the margin: no suffix; a bad margin box: no line (Run names the problem)
    assert "would detect" not in plan_line(detectable(needed, 0.1, margin=0.02))
    assert plan_text(24, 0, 0.1, "x") == "" and plan_text(24, 0, 0.1, 1.5) == ""


# ── per-field scores ──────────────────────────────────────────────────────────────────────────

INVOICE = json.dumps({"total": "12.50", "date": "2024-01-02", "items": [{"name": "tea", "price": 2}, {"name": "cake", "price": 3}]})


def test_key_value_outcomes_by_hand():
    answer = '```json\n{"total": "12.50 ", "date": "2024-02-01", "items": [{"name": "tea", "price": "2"}], "vat": 1}\n```'
    got = field_outcomes(answer, INVOICE)
    # total right (trimmed); date wrong; items[0].name right, items[0].price wrong ("2" is not 2);
    # items[1] missing (name and price); vat extra
    assert {k: dict(v) for k, v in got.items()} == {
        "$.total": {"right": 1}, "$.date": {"wrong": 1}, "$.items[*].name": {"right": 1, "missing": 1},
        "$.items[*].price": {"wrong": 1, "missing": 1}, "$.vat": {"extra": 1}}
    broken = field_outcomes("the total is 12.50", INVOICE)
    assert {k: dict(v) for k, v in broken.items()} == {
        "$.total": {"missing": 1}, "$.date": {"missing": 1}, "$.items[*].name": {"missing": 2},
        "$.items[*].price": {"missing": 2}}


def test_table_outcomes_by_hand():
    truth = "<table><tr><th>Year</th><th>Sales</th></tr><tr><td>2020</td><td>10</td></tr><tr><td>2021</td><td>12</td></tr></table>"
    answer = ("<table><tr><td>sales</td><td>Year</td><td>Note</td></tr><tr><td>10</td><td>2020</td><td>x</td></tr>"
              "<tr><td>13</td><td>2021</td><td>y</td></tr><tr><td>14</td><td>2022</td><td>z</td></tr></table>")
    got = {k: dict(v) for k, v in field_outcomes(answer, truth).items()}
    # columns matched by header, any order, any case; the third body row and the Note column are extra
    assert got == {"Year": {"right": 2, "extra": 1}, "Sales": {"right": 1, "wrong": 1, "extra": 1},
                   "Note": {"extra": 3}}
    csv_truth = "name,score\nann,3\nbob,4\n"
    got_csv = {k: dict(v) for k, v in field_outcomes("name,score\nann,3\n", csv_truth).items()}
    assert got_csv == {"name": {"right": 1, "missing": 1}, "score": {"right": 1, "missing": 1}}


@pytest.mark.parametrize("reference,kind", [("red", None), ("12", None), ('"a"', None), ("{", None),
                                            ('{"a": 1}', "key-value"), ("[1, 2]", "key-value"),
                                            ("<table><tr><td>a</td></tr></table>", "table"),
                                            ("a,b\n1,2", "table"), ("a, b", None), (None, None)])
def test_reference_kind(reference, kind):
    assert reference_kind(reference) == kind


def sample(index, answer_a, answer_b, reference, correct_a=None, correct_b=None, agree=None, error=None):
    return SampleResult(index=index, sample_id=str(index), category=None, prompt="p", reference=reference,
                        answer_a=answer_a, answer_b=answer_b, correct_a=correct_a, correct_b=correct_b,
                        exact_a=None, exact_b=None, agree=answer_a == answer_b if agree is None else agree,
                        first_divergence=None, logprob_a_under_b=None, logprob_b_under_a=None, kl_mean=None,
                        kl_q90=None, kl_q99=None, kl_max=None, image_tokens=None, blank_same_a=None,
                        blank_same_b=None, level_norms_a=None, level_norms_b=None, error=error)


def test_field_scores_say_which_fields_moved():
    truth = json.dumps({"total": "5", "date": "d1"})
    rows = [sample(0, '{"total": "5", "date": "d1"}', '{"total": "5", "date": "d2"}', truth),
            sample(1, '{"total": "6", "date": "d1"}', '{"total": "6", "date": "d1", "shop": "x"}', truth),
            sample(2, "red", "blue", "red"),  # not structured: left out
            sample(3, "", "", truth, error="image not found")]
    block = field_scores(rows)
    assert block.rows == 2
    fields = block.fields
    assert fields["$.date"].a == {"right": 2, "wrong": 0, "missing": 0, "extra": 0}
    assert fields["$.date"].b == {"right": 1, "wrong": 1, "missing": 0, "extra": 0}
    assert fields["$.date"].moved == 1 and fields["$.date"].right_change == -1
    assert fields["$.total"].moved == 0 and fields["$.total"].a["wrong"] == 1
    assert fields["$.shop"].b["extra"] == 1 and fields["$.shop"].a["extra"] == 0
    assert block.moved == ["$.date", "$.shop"]
    assert field_scores([sample(0, "a", "b", "a")]) is None


def test_summary_carries_equivalence_detectable_and_fields():
    rows = [sample(i, "x", "x", "x", correct_a=True, correct_b=True) for i in range(40)]
    rows += [sample(40, "x", "y", "x", correct_a=True, correct_b=False)]
    summary = summarise(rows, "a", "b", margin=0.1, discordance=0.2)
    test = summary.equivalence
    assert test.n == 41 and test.margin == 0.1
    assert test.p_value == pytest.approx(tost_paired(1, 0, 41, 0.1).p_value)
    assert summary.detectable.at_assumed == pytest.approx(scipy_detectable(41, 0.2), abs=1e-9)
    assert summary.detectable.discordance_observed == pytest.approx(1 / 41)
    assert summary.noise_floor is None and summary.fields is None
    floor = summarise(rows, "a", "a again", same_arm=True).noise_floor
    assert floor.to_dict() == {"rows": 41, "disagree": 1, "text_differs": 1, "discordant": 1,
                               "rate": pytest.approx(1 / 41)}


def test_the_tab_hides_the_field_table_without_structured_references():
    """A dataset of plain answers: no per-field table (an empty one under its headers read as "no
    field moved"), one line in the Equivalence block instead; a key-value dataset: the table."""
    plain = summarise([sample(0, "red", "blue", "red"), sample(1, "x", "x", "x")], "a", "b")
    text, table, _drift = result_values(plain)
    assert table["visible"] is False and table["value"] == [] and f"- {NO_FIELDS}" in text.splitlines()
    truth = json.dumps({"total": "5"})
    structured = summarise([sample(0, '{"total": "5"}', '{"total": "6"}', truth)], "a", "b")
    text, table, _drift = result_values(structured)
    assert table["visible"] is True and [row[0] for row in table["value"]] == ["$.total"] and NO_FIELDS not in text


@pytest.mark.parametrize("bad", [0, 1, -0.1, 2, "0.02", True])
def test_bad_margin_is_one_line(bad):
    with pytest.raises(G4VError) as err:
        EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data="x", margin=bad).check()
    assert "\n" not in str(err.value) and "margin" in str(err.value)


# ── the noise floor, for real ────────────────────────────────────────────────────────────────


def test_noise_floor_of_a_deterministic_hf_arm_is_zero(hf_engine, tmp_path):
    """The bundled checkpoint answers the first rows of the bundled dataset twice: no disagreement."""
    arm = ArmSpec("hf")
    config = EvalConfig(a=arm, b=ArmSpec("hf", label="hf again"), data=str(BUNDLED_DATASET), limit=6,
                        max_new_tokens=6)
    planned = []
    result = run_eval(config, tmp_path / "floor", reuse={arm.engine_key(): hf_engine}, plan=planned.append)
    assert planned[0].rows == 6 and planned[0].discordance_assumed == config.discordance
    floor = result.summary.noise_floor.to_dict()
    assert floor == {"rows": 6, "disagree": 0, "text_differs": 0, "discordant": 0, "rate": 0.0}
    assert all(row.answer_a == row.answer_b and row.agree for row in result.rows)
    assert result.summary.paired.a_only == result.summary.paired.b_only == 0


def test_cli_b_same_prints_the_plan_and_the_noise_floor(tmp_path):
    out = tmp_path / "floor"
    done = run_cli("eval", "--a", "hf", "--b", "same", "--data", str(BUNDLED_DATASET), "--limit", "4",
                   "--max-new-tokens", "4", "--margin", "0.05", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "detectable difference at 80% power" in done.stderr and "on 4 rows" in done.stderr
    assert "noise floor (A run twice): 0 of 4 rows disagree" in done.stdout
    assert "margin ±5 points" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arms"]["b"]["label"] == f"{summary['arms']['a']['label']} again"
    assert summary["noise_floor"]["disagree"] == 0 and summary["equivalence"]["margin"] == 0.05


@pytest.mark.slow  # about 4 s on a quiet 2-core machine
def test_a_document_dataset_says_which_fields_moved(tmp_path):
    """The documents checkpoint (reads charts and extracts key-value JSON) against the shapes
    checkpoint (answers in a word) on two held-out charts and two key-value pictures: every field
    moved, and the counts agree with the documents metrics computed on the same answers."""
    from g4v.demo.documents_data import held_out_items
    from g4v.documents import metrics
    from g4v.paths import REPO_ROOT

    lines = []
    for i, item in enumerate(held_out_items(2)):
        item.image.save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"image": f"{i}.png", "prompt": item.qa.question, "answer": item.qa.answer,
                                 "category": item.qa.kind}))
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    config = EvalConfig(a=ArmSpec("hf", model=str(REPO_ROOT / "assets/granite4-vision-tiny-documents")),
                        b=ArmSpec("hf", model=str(REPO_ROOT / "assets/granite4-vision-tiny-trained")),
                        data=str(tmp_path / "docs.jsonl"), max_new_tokens=96)
    result = run_eval(config, tmp_path / "run")
    block = result.summary.fields
    assert block.rows == 4
    kvp = [row for row in result.rows if row.category == "kvp"]
    leaves = sum(len(metrics.leaf_values(json.loads(row.reference))) for row in kvp)
    for side in "ab":
        counted = [getattr(score, side) for name, score in block.fields.items() if name.startswith("$.")]
        right = sum(sum(metrics.key_value_match(getattr(row, f"answer_{side}"), json.loads(row.reference)).fields.values())
                    for row in kvp)
        assert sum(c["right"] for c in counted) == right
        assert sum(c["right"] + c["wrong"] + c["missing"] for c in counted) == leaves
    # the one-word answers have no field at all; the documents model gets some right, so all moved
    assert all(score.b["right"] == 0 for score in block.fields.values())
    assert set(block.moved) == {name for name, s in block.fields.items() if s.a != s.b}
    assert {"label", "value", "$.count"} <= set(block.fields)
    bars = sum(row.reference.strip().count("\n") for row in result.rows if row.category == "chart")
    for column in ("label", "value"):  # each chart's body cells, counted once per arm
        assert sum(block.fields[column].b.values()) == bars
