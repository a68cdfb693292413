"""Evaluate arms with a vision LoRA mode: "what does the vision LoRA change" as a dataset run.

On the layout checkpoint (base weights with the vision LoRA beside them), ``hf`` runs the vision
model and ``hf:vision-lora=off`` the base language model alone: the run must show the accuracy drop
with each arm's 95 % interval. The expected numbers are computed here independently: each arm's
engine is loaded directly (no arm code), asked every row, its answers matched to the references
with plain string code, and the Wilson intervals taken from scipy.
"""

import json

import pytest
from scipy.stats import binomtest

from g4v.conversation import Message, SamplingSettings
from g4v.engines.base import GenerationRequest
from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, ArmSpec, Columns
from g4v.evaluate.data import open_dataset
from g4v.evaluate.run import row_order
from g4v.paths import VLORA_MODEL_DIR
from tests.cli import run_cli

LAYOUT = str(VLORA_MODEL_DIR)
ROWS, SEED, TOKENS = 24, 5, 8


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("vision-lora-run")
    done = run_cli("eval", "--a", f"hf:model={LAYOUT}", "--b", f"hf:model={LAYOUT},vision-lora=off",
                   "--data", str(BUNDLED_DATASET), "--limit", str(ROWS), "--seed", str(SEED),
                   "--max-new-tokens", str(TOKENS), "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return {"summary": json.loads((out / "summary.json").read_text()),
            "settings": json.loads((out / "run.json").read_text()), "stdout": done.stdout}


@pytest.fixture(scope="module")
def engines():
    from g4v.engines.hf import TransformersEngine

    return {mode: TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora=mode)
            for mode in ("native", "off")}


def independent_accuracy(engine) -> tuple[int, int]:
    """Right answers of ``engine`` over the run's rows, counted without the arms."""
    dataset = open_dataset(str(BUNDLED_DATASET), Columns())
    right = 0
    for index in row_order(len(dataset), ROWS, SEED):
        sample = dataset.sample(index)
        answer = engine.generate([Message("user", sample.prompt, list(sample.images))],
                                 SamplingSettings(max_new_tokens=TOKENS, temperature=0)).text
        right += answer.strip().strip(".").lower() == sample.reference.strip().lower()
    return right, ROWS


@pytest.mark.training  # scores the checkpoint on 24 rows, twice in each mode
def test_the_run_shows_the_vision_loras_accuracy_drop_with_intervals(run, engines):
    arms = run["summary"]["arms"]
    for side, mode in (("a", "native"), ("b", "off")):
        right, n = independent_accuracy(engines[mode])
        assert arms[side]["n_scored"] == n
        assert arms[side]["accuracy"] == pytest.approx(right / n)
        interval = binomtest(right, n).proportion_ci(method="wilson")
        assert arms[side]["ci95"] == pytest.approx([interval.low, interval.high], abs=1e-6)
    # the drop is real at this size: the intervals do not overlap
    assert arms["a"]["accuracy"] >= 0.75 and arms["a"]["ci95"][0] > arms["b"]["ci95"][1]
    assert run["summary"]["paired"]["a_only"] > run["summary"]["paired"]["b_only"]


@pytest.mark.training  # the 24-row run above
def test_the_run_records_each_arms_mode(run):
    assert run["settings"]["a"]["vision_lora"] is None and run["settings"]["b"]["vision_lora"] == "off"
    assert "[vision LoRA off]" in run["summary"]["arms"]["b"]["label"]
    assert "[vision LoRA off]" in run["stdout"]


@pytest.mark.parametrize("text, expected", [
    ("hf:vision-lora=off", ArmSpec("hf", vision_lora="off")),
    ("vllm:vision-lora=merged", ArmSpec("vllm", vision_lora="merged")),
    ("hf:model=M,vision-lora=native,adapter=x", ArmSpec("hf", model="M", adapter="x", vision_lora="native")),
])
def test_arms_take_the_mode(text, expected):
    assert ArmSpec.parse(text) == expected
    assert ArmSpec.parse(text).engine_key() != ArmSpec(expected.backend, expected.model)


@pytest.mark.parametrize("text, words", [
    ("hf:vision-lora=sometimes", "unknown vision LoRA mode"),
    ("openai:http://127.0.0.1:9/v1,vision-lora=off", "the server's choice"),
])
def test_a_bad_mode_is_one_line(text, words):
    with pytest.raises(G4VError, match=words) as caught:
        ArmSpec.parse(text)
    assert "\n" not in str(caught.value)


def test_a_mode_on_a_checkpoint_without_a_vision_lora_is_refused_before_loading(tmp_path):
    done = run_cli("eval", "--a", "hf", "--b", "hf:vision-lora=off", "--data", str(BUNDLED_DATASET),
                   "--limit", "2", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "has none" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_tab_offers_the_modes_of_a_layout_checkpoint(engines):
    from webapp.evaluate_choices import arm_choices

    keys = {choice.key: choice.spec for choice in arm_choices(engines["native"], LAYOUT)}
    assert keys["app:vision-lora=off"] == ArmSpec("hf", LAYOUT, label="hf vision-lora=off", vision_lora="off")
    assert "app:vision-lora=merged" in keys and "app:vision-lora=native" not in keys  # "app" is native


def test_a_run_recorded_before_arms_had_a_mode_resumes_and_another_mode_is_another_run(tmp_path):
    from dataclasses import asdict

    import g4v.evaluate.store as store
    from g4v.evaluate import EvalConfig

    config = EvalConfig(a=ArmSpec("hf", LAYOUT), b=ArmSpec("hf", LAYOUT), data=str(BUNDLED_DATASET))
    old = asdict(config)
    for arm in ("a", "b"):
        del old[arm]["vision_lora"]  # run.json as written before this field existed
    store.prepare(tmp_path, old)
    store.prepare(tmp_path, asdict(config))  # the same question: resumes
    other = EvalConfig(a=config.a, b=ArmSpec("hf", LAYOUT, vision_lora="off"), data=str(BUNDLED_DATASET))
    with pytest.raises(G4VError, match="differs in b"):
        store.prepare(tmp_path, asdict(other))


def test_a_run_written_before_the_precision_settings_and_drift_column_resumes(tmp_path):
    """run.json without the arms' dtype/quant keys and rows without the ``level_drift`` column (a run
    started before they existed) resume: nothing is computed again and the rows read back as written,
    the new column empty; a row lacking a column that was always there is still damaged."""
    import json
    from dataclasses import asdict

    import g4v.evaluate.store as store
    from g4v.evaluate import EvalConfig, run_eval
    from g4v.evaluate.run import SampleResult

    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(BUNDLED_DATASET), limit=2, max_new_tokens=3)
    first = run_eval(config, tmp_path)
    old = asdict(config)
    for arm in ("a", "b"):
        for key in ("dtype", "quant", "quant_vision"):
            del old[arm][key]
    (tmp_path / store.RUN_FILE).write_text(json.dumps(old))
    rows = [json.loads(line) for line in (tmp_path / store.ROWS_FILE).read_text().splitlines()]
    for row in rows:
        del row["level_drift"]
    (tmp_path / store.ROWS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    again = run_eval(config, tmp_path)
    assert [asdict(row) for row in again.rows] == [asdict(row) for row in first.rows]
    assert len((tmp_path / store.ROWS_FILE).read_text().splitlines()) == 2  # nothing answered again
    del rows[0]["prompt"]
    (tmp_path / store.ROWS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(G4VError, match="line 1 of samples.jsonl is damaged"):
        store.read_rows(tmp_path, SampleResult)


#: Every arm kind the Evaluate tab offers on the layout checkpoint: the vision LoRA's three modes,
#: each with no adapter and with each bundled adapter (both made for the vision model: stacked on
#: the vision LoRA in native mode, a list of PEFT adapters that batches once grouped by as a key).
ARM_KINDS = [(mode, adapter) for mode in ("native", "off", "merged") for adapter in (None, "tiny-trained-french", "demo-lora")
             if not (mode == "off" and adapter)]  # an adapter made for the vision model needs the vision LoRA


@pytest.mark.slow  # three engines, six arm kinds, a batch and one by one each
def test_every_arm_kind_on_the_layout_checkpoint_answers_in_batches_as_one_by_one():
    """``generate_batch`` (what an arm runs) gives each arm kind the greedy tokens ``generate``
    gives one request at a time; with a stacked adapter it failed with a TypeError (its active
    adapters, a list, were a dict key)."""
    from g4v.engines.hf import TransformersEngine
    from g4v.lora.activation import activate_adapter
    from tests.test_engine_batch import MIXED

    greedy = SamplingSettings(max_new_tokens=6)
    for mode in ("native", "off", "merged"):
        engine = TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora=mode)
        for adapter in [adapter for kind, adapter in ARM_KINDS if kind == mode]:
            name = activate_adapter(engine, adapter).name if adapter else None
            alone = [engine.generate(messages, greedy, adapter=name).token_ids for messages in MIXED]
            assert [g.token_ids for g in engine.generate_batch([GenerationRequest(messages, greedy, name) for messages in MIXED], in_flight=4)] == alone, \
                (mode, adapter)


@pytest.mark.slow  # four small runs on the layout checkpoint
@pytest.mark.parametrize("arm_a, arm_b", [
    ("", "adapter=tiny-trained-french"),  # the tab's default pairing on this checkpoint
    ("", "adapter=demo-lora"),
    ("vision-lora=off", "adapter=tiny-trained-french"),
    ("vision-lora=merged", "adapter=tiny-trained-french"),
])
def test_a_run_with_an_adapter_arm_on_the_layout_checkpoint_answers_as_its_engine(arm_a, arm_b, tmp_path):
    from g4v.engines.hf import TransformersEngine
    from g4v.evaluate import run_eval
    from g4v.evaluate.run import EvalConfig
    from g4v.lora.activation import activate_adapter

    def spec(extra: str) -> ArmSpec:
        return ArmSpec.parse(f"hf:model={LAYOUT}" + (f",{extra}" if extra else ""))

    config = EvalConfig(a=spec(arm_a), b=spec(arm_b), data=str(BUNDLED_DATASET), limit=4, max_new_tokens=6)
    result = run_eval(config, tmp_path / "run")
    assert result.summary.n_errors == 0 and len(result.rows) == 4
    dataset = open_dataset(str(BUNDLED_DATASET), Columns())
    for side, arm in (("a", config.a), ("b", config.b)):
        engine = TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora=arm.vision_lora or "native")
        name = activate_adapter(engine, arm.adapter).name if arm.adapter else None
        for row in result.rows:
            sample = dataset.sample(row.index)
            alone = engine.generate([Message("user", sample.prompt, list(sample.images))], SamplingSettings(max_new_tokens=6),
                                    adapter=name)
            assert getattr(row, f"answer_{side}") == alone.text, (side, arm)
