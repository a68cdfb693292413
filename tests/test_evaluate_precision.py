"""Precision arms in Evaluate, on the trained demo checkpoint over the bundled dataset: float32
against bfloat16 and against int8 weights (torchao), with the per-level drift of each row checked
against the shared layer's own drift on that row's picture, and bad arm values refused in one line."""

import json

import pytest

from g4v.conversation import Message
from g4v.engines.hf import TransformersEngine
from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, run_eval
from g4v.evaluate.data import Columns, open_dataset
from g4v.evaluate.run import row_order
from g4v.model.precision import Precision, precision_drift
from g4v.paths import TRAINED_MODEL_DIR

ROWS = 4


@pytest.fixture(scope="module")
def trained_engine():
    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def bf16_run(trained_engine, tmp_path_factory):
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec.parse("hf:dtype=bfloat16"), data=str(BUNDLED_DATASET),
                        limit=ROWS, max_new_tokens=6)
    return run_eval(config, tmp_path_factory.mktemp("bf16"), reuse={ArmSpec("hf"): trained_engine})


def test_bf16_arm_records_per_level_drift_that_the_shared_layer_reproduces(bf16_run, trained_engine):
    bf16 = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="bfloat16")
    dataset = open_dataset(str(BUNDLED_DATASET), Columns())
    assert len(bf16_run.rows) == ROWS
    for row, index in zip(bf16_run.rows, row_order(len(dataset), ROWS, None)):
        sample = dataset.sample(index)
        expected = precision_drift(trained_engine, bf16, [Message("user", sample.prompt, list(sample.images))],
                                   Precision(), Precision("bfloat16"))
        recorded = json.loads(row.level_drift)
        assert recorded["next_token_kl"] == pytest.approx(expected.next_token_kl, rel=1e-6, abs=1e-12)
        assert sorted(recorded["levels"]) == sorted(level.name for level in expected.levels)
        for level in expected.levels:
            assert recorded["levels"][level.name]["rel_error"] == pytest.approx(level.rel_error, rel=1e-9)
            assert recorded["levels"][level.name]["cosine"] == pytest.approx(level.cosine, rel=1e-12)
            assert level.rel_error > 0
    summary = bf16_run.summary
    drift = summary.level_drift
    assert drift.n == ROWS and drift.of == "hf[bfloat16]" and drift.against == "hf"
    rel = [json.loads(row.level_drift)["levels"]["deepstack0"]["rel_error"] for row in bf16_run.rows]
    assert drift.levels["deepstack0"].rel_error_mean == pytest.approx(sum(rel) / len(rel))
    assert summary.kl is not None  # the teacher-forced KL of every hf pair, as before
    assert summary.arms.b.label == "hf[bfloat16]"


def test_cli_report_prints_the_drift_table(bf16_run):
    from g4v.commands.eval import summary_table

    table = summary_table(bf16_run.summary)
    assert "per-level drift of B against A over 4 rows" in table
    assert sum(line.startswith(("deepstack", "spatial_")) for line in table.splitlines()) == 8


def test_the_tab_shows_the_drift_table_of_a_precision_pair(bf16_run):
    """The Evaluate tab's drift table: one row per level, each the rows' own mean and extreme
    (recomputed here from the per-row JSON), the same cells the CLI prints."""
    from g4v.commands.eval import summary_table
    from webapp.evaluate_equivalence import result_values

    *_, drift = result_values(bf16_run.summary)
    assert drift["visible"] is True and "over 4 rows" in drift["label"] and "B = hf[bfloat16], A = hf" in drift["label"]
    per_row = [json.loads(row.level_drift)["levels"] for row in bf16_run.rows]
    assert [cells[0] for cells in drift["value"]] == list(per_row[0])  # every level, in the model's order
    three_digits = 5e-3  # errors are shown to 3 significant digits: within half a unit of the third
    for name, rel_mean, rel_max, cos_mean, cos_min in drift["value"]:
        rel, cos = [row[name]["rel_error"] for row in per_row], [row[name]["cosine"] for row in per_row]
        assert float(rel_mean) == pytest.approx(sum(rel) / len(rel), rel=three_digits)
        assert float(rel_max) == pytest.approx(max(rel), rel=three_digits) and float(cos_min) == pytest.approx(min(cos), abs=1e-6)
        assert float(cos_mean) == pytest.approx(sum(cos) / len(cos), abs=1e-6)
    printed = summary_table(bf16_run.summary).splitlines()
    for cells in drift["value"]:
        assert [line.split() for line in printed if line.startswith(cells[0] + " ")] == [cells]


def test_arms_in_one_precision_record_no_drift(trained_engine, tmp_path):
    from webapp.evaluate_equivalence import result_values

    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf", adapter="tiny-trained-french"), data=str(BUNDLED_DATASET),
                        limit=1, max_new_tokens=2)
    result = run_eval(config, tmp_path / "run", reuse={ArmSpec("hf"): trained_engine})
    assert result.rows[0].level_drift is None and result.summary.level_drift is None
    assert "level_drift" not in result.summary.to_dict()
    *_, drift = result_values(result.summary)
    assert drift["visible"] is False and drift["value"] == []  # no precision pair: no drift table


def test_int8_arm_with_the_vision_kept_drifts_only_after_the_injections(trained_engine, tmp_path):
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec.parse("hf:quant=int8,quant-vision=no"), data=str(BUNDLED_DATASET),
                        limit=2, max_new_tokens=4)
    result = run_eval(config, tmp_path / "run", reuse={ArmSpec("hf"): trained_engine})
    drift = result.summary.level_drift
    assert drift.of == "hf[int8 weights, vision kept in float32]"
    assert all(level.rel_error_max == 0.0 for level in drift.levels.values())  # the vision part is float32
    assert drift.next_token_kl_mean > 0.0


def test_precision_arm_parses():
    spec = ArmSpec.parse("hf:quant=int8,quant-vision=no,dtype=bf16")
    assert (spec.dtype, spec.quant, spec.quant_vision) == ("bfloat16", "int8", False)
    assert spec.engine_key() != ArmSpec("hf").engine_key()
    assert ArmSpec.parse("hf:quant=int8").quant_vision is True


@pytest.mark.parametrize("text, message", [
    ("hf:dtype=int4", "arm 'hf:dtype=int4': dtype must be one of float32, bfloat16, float16, got 'int4'"),
    ("hf:quant=nf4", "arm 'hf:quant=nf4': quant must be int8 (torchao int8 weight-only), got 'nf4'"),
    ("hf:quant=int8,quant-vision=maybe", "arm 'hf:quant=int8,quant-vision=maybe': quant-vision must be yes or no, "
                                         "got 'maybe'"),
    ("hf:quant-vision=no", "arm 'hf:quant-vision=no': quant-vision= says what quant= does to the vision part: "
                           "give quant=int8 with it"),
    ("vllm:dtype=bfloat16", "arm 'vllm:dtype=bfloat16': dtype=, quant= and quant-vision= are for hf arms "
                            "(transformers here)"),
    # a key given twice was the last one, silently
    ("hf:keep=50,keep=10", "arm 'hf:keep=50,keep=10': keep= is given twice; give it once"),
    ("hf:dtype=bf16,dtype=fp16", "arm 'hf:dtype=bf16,dtype=fp16': dtype= is given twice; give it once"),
    ("hf:adapter=a,adapter=b", "arm 'hf:adapter=a,adapter=b': adapter= is given twice; give it once"),
])
def test_bad_precision_arm_is_one_line(text, message):
    with pytest.raises(G4VError) as err:
        ArmSpec.parse(text)
    assert str(err.value) == message


def test_the_tab_offers_the_apps_model_in_other_precisions(trained_engine):
    from webapp.evaluate_choices import arm_choices, pick_arm

    choices = arm_choices(trained_engine, str(TRAINED_MODEL_DIR))
    keys = [choice.key for choice in choices]
    assert "app:dtype=bfloat16" in keys and "app:dtype=float16" in keys
    assert "app:dtype=float32" not in keys  # the app's own arm runs in float32 here
    assert keys.index("app+tiny-trained-french") == 1  # arm B's default is unchanged
    spec = pick_arm("app:dtype=bfloat16", choices, "B")
    assert (spec.dtype, spec.model) == ("bfloat16", str(TRAINED_MODEL_DIR))
    assert spec.engine_key() != choices[0].spec.engine_key()  # an engine of its own, not the app's
    assert "app:quant=int8,quant-vision=no" in keys  # torchao is in requirements.txt


def test_cli_refuses_a_bad_precision_arm_in_one_line(tmp_path):
    from tests.cli import run_cli

    result = run_cli("eval", "--a", "hf", "--b", "hf:quant=int8,quant-vision=later", "--data", str(BUNDLED_DATASET),
                     "--out", str(tmp_path / "run"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: arm 'hf:quant=int8,quant-vision=later': quant-vision must be yes or no, got 'later'"]
    assert not (tmp_path / "run").exists()  # refused before the run folder was made
