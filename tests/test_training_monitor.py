"""The training monitor on a real ``transformers.Trainer`` run of the bundled checkpoint: its
numbers against the Deepstack inspector on each step's saved checkpoint and against an independent
computation, in the Trainer's logs and TensorBoard's files, hooks gone however training ends, and
planted collapses and explosions warned at their step."""

import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from g4v.model.capture import token_norms
from g4v.model.levels import describe_levels
from g4v.training.callback import DeepstackCallback, monitor_training
from g4v.training.monitor import DeepstackMonitor
from g4v.training.records import COLLAPSE, EXPLOSION, metric_key
from g4v.training.settings import MonitorSettings
from tests.training_runs import examples, fresh_model, hook_count, make_trainer

STEPS = 4
FLOAT32 = {"rel": 1e-5, "abs": 1e-6}  # float32: the same arithmetic, run twice


@pytest.fixture(scope="module")
def items(hf_engine):
    return examples(hf_engine)


@pytest.fixture(scope="module")
def trained(items, tmp_path_factory):
    """A 4-step Trainer run, every step measured and saved, with TensorBoard."""
    model = fresh_model()
    with torch.no_grad():  # transformers adds its own output-capture hooks at the first forward
        model(**items[0][2])
    before = hook_count(model)
    run = make_trainer(model, items, tmp_path_factory.mktemp("run"), STEPS)
    with monitor_training(run.trainer, MonitorSettings(every=1)) as callback:
        run.trainer.train()
    return run, callback.history, model, before


def projector_weights(folder: Path, level) -> dict[str, torch.Tensor]:
    prefix = (f"model.layerwise_projectors.{level.index}." if level.kind == "deepstack"
              else f"model.spatial_projectors.{('TL', 'TR', 'BL', 'BR').index(level.offset)}.")
    return {name: value for name, value in load_file(folder / "model.safetensors").items() if name.startswith(prefix)}


def inspector_numbers(folder: Path, picture, prompt: str, out: Path) -> dict[str, dict]:
    """Per level, what the Deepstack inspector reads on the checkpoint in ``folder``."""
    from g4v.engines.hf import TransformersEngine
    from g4v.inspect.run import run_inspection

    engine = TransformersEngine(str(folder), device="cpu", dtype="float32")
    try:
        capture = run_inspection(engine, picture, prompt, full=True, max_new_tokens=0, out_dir=out,
                                 make_zip=False).capture
    finally:
        engine.close()
    numbers = {}
    for cap in capture.levels:
        before = cap.residual_before[capture.image_mask]  # (image tokens, hidden): the stream it is added to
        at_zero = cap.level.llm_layer == 0  # there the stream at the image tokens is the zeroed placeholders
        residual = cap.residual_norm_before_text if at_zero else cap.residual_norm_before_image
        numbers[cap.level.name] = {
            "injected_norm": cap.injected_norm_mean, "residual_norm": residual,
            "ratio": cap.injected_norm_mean / residual,
            # A token whose two norms are equal within float32 noise may count either way.
            "dominant_share": [float((token_norms(cap.injected) > token_norms(before) * (1 + sign * FLOAT32["rel"]))
                                     .float().mean()) for sign in (1, -1)]}
    return numbers


def test_forward_numbers_equal_the_inspector_on_each_steps_checkpoint(trained, items, tmp_path):
    """Step s's forward runs on the weights saved after step s-1 (checkpoint-0: the initial ones)."""
    run, history, _, _ = trained
    assert [record.step for record in history] == list(range(1, STEPS + 1))
    for record, index in zip(history, run.batches):
        picture, prompt, _ = items[index]
        expected = inspector_numbers(run.folder / f"checkpoint-{record.step - 1}", picture, prompt,
                                     tmp_path / str(record.step))
        for level in record.levels:
            lowest, highest = expected[level.name].pop("dominant_share")
            assert lowest - 1e-6 <= level.dominant_share <= highest + 1e-6, (record.step, level.name)
            for metric, value in expected[level.name].items():
                assert getattr(level, metric) == pytest.approx(value, **FLOAT32), (record.step, level.name, metric)
    assert any(0 < level.dominant_share < 1 for record in history for level in record.levels)


def test_gradient_and_update_norms_equal_an_independent_computation(trained, items):
    """The gradient: checkpoint s-1 forward and backward on step s's batch, clipped as the Trainer
    clips (max_grad_norm 1); the update: checkpoint s minus checkpoint s-1, from the saved files."""
    run, history, trained_model, _ = trained
    levels = describe_levels(trained_model.config)
    for record, index in zip(history, run.batches):
        before, after = run.folder / f"checkpoint-{record.step - 1}", run.folder / f"checkpoint-{record.step}"
        model = fresh_model(before)
        model.train()
        model(**items[index][2]).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        named = dict(model.named_parameters())
        for level, logged in zip(levels, record.levels):
            old, new = projector_weights(before, level), projector_weights(after, level)
            update = math.sqrt(sum(float(((new[n] - old[n]) ** 2).sum()) for n in old))
            grad = math.sqrt(sum(float((named[n].grad ** 2).sum()) for n in old))
            assert logged.update_norm == pytest.approx(update, rel=1e-5), (record.step, level.name)
            assert logged.grad_norm == pytest.approx(grad, rel=1e-4), (record.step, level.name)


def test_records_are_in_trainer_state_and_in_tensorboards_files(trained):
    """Read back with json and with TensorBoard's own reader; the Trainer still logs its loss at
    every step (logging a record must not swallow the step's own log)."""
    import json

    from tensorboard.backend.event_processing import event_accumulator

    run, history, _, _ = trained
    state = json.loads((run.folder / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]
    events = sorted((run.folder / "runs").rglob("events.out.tfevents.*"))
    assert events
    reader = event_accumulator.EventAccumulator(str(events[0]), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    for record in history:
        logged = {key: value for entry in state if entry["step"] == record.step for key, value in entry.items()}
        assert "loss" in logged
        for key, value in record.to_logs().items():
            assert logged[key] == value, key
            scalars = {event.step: event.value for event in reader.Scalars("train/" + key)}
            assert scalars[record.step] == pytest.approx(value, rel=1e-6), key
    assert metric_key("spatial_BR", "ratio") in record.to_logs()


def test_the_callback_changes_no_weight(trained, items, tmp_path):
    """The same run without the callback ends on bit-identical weights."""
    run, _, model, _ = trained
    plain = fresh_model()
    other = make_trainer(plain, items, tmp_path, STEPS, save=False, tensorboard=False)
    other.trainer.train()
    assert other.batches == run.batches
    for (name, a), b in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(a, b), name


def test_hooks_are_gone_after_training_ends_and_after_it_fails(trained, items, tmp_path):
    run, _, model, before = trained
    assert hook_count(model) == before  # ended (monitor_training)

    alone = fresh_model()  # the callback on its own: gone at on_train_end
    with torch.no_grad():
        alone(**items[0][2])
    at_rest = hook_count(alone)
    ended = make_trainer(alone, items, tmp_path / "alone", 2, save=False, tensorboard=False)
    ended.trainer.add_callback(DeepstackCallback(ended.trainer, MonitorSettings(every=1)))
    ended.trainer.train()
    assert hook_count(alone) == at_rest

    # A failure inside a measured step's forward pass, after the monitor's hooks were added.
    failing = fresh_model()
    with torch.no_grad():
        failing(**items[0][2])
    at_rest = hook_count(failing)
    broken = make_trainer(failing, items, tmp_path / "broken", 3, save=False, tensorboard=False)

    def fail_at_step_two(module, args, output):
        if broken.trainer.state.global_step == 1:
            raise RuntimeError("planted failure")

    planted = failing.model.language_model.layers[5].register_forward_hook(fail_at_step_two)
    with pytest.raises(RuntimeError, match="planted failure"):
        with monitor_training(broken.trainer, MonitorSettings(every=1)):
            broken.trainer.train()
    planted.remove()
    assert hook_count(failing) == at_rest
    assert DeepstackCallback not in [type(c) for c in broken.trainer.callback_handler.callbacks]

    # The same in a custom loop.
    def fail(module, args, output):
        raise RuntimeError("planted failure")

    with DeepstackMonitor(failing, MonitorSettings(every=1)) as monitor:
        planted = failing.model.language_model.layers[5].register_forward_hook(fail)
        with pytest.raises(RuntimeError, match="planted failure"):
            with monitor.step(1):
                failing(**items[0][2])
        planted.remove()
        assert hook_count(failing) == at_rest and monitor.history == []


def _scaling(factor: float, when):
    def hook(module, args, output):
        return output * factor if when() else None
    return hook


def test_a_planted_collapse_is_warned_at_its_step(items, tmp_path, caplog):
    """deepstack1's projector output scaled by 1e-3 from step 4's forward on, in a Trainer run."""
    model = fresh_model()
    run = make_trainer(model, items, tmp_path, 6, save=False, tensorboard=False)
    planted = model.model.layerwise_projectors[1].register_forward_hook(
        _scaling(1e-3, lambda: run.trainer.state.global_step >= 3))
    with caplog.at_level(logging.WARNING, logger="g4v.training"):
        with monitor_training(run.trainer, MonitorSettings(every=1)) as callback:
            run.trainer.train()
    planted.remove()
    alerts = [alert for record in callback.history for alert in record.alerts]
    assert [(a.step, a.level, a.kind) for a in alerts][:1] == [(4, "deepstack1", COLLAPSE)]
    assert {a.level for a in alerts} == {"deepstack1"}
    assert "step 4: deepstack1 collapse" in caplog.text
    logged = [e for e in run.trainer.state.log_history if metric_key("deepstack1", "alert") in e]
    assert [(e["step"], e[metric_key("deepstack1", "alert")]) for e in logged][:4] == \
        [(1, 0), (2, 0), (3, 0), (4, COLLAPSE)]


@pytest.mark.parametrize("every, warned", [(1, 3), (2, 4)])
def test_a_planted_explosion_is_warned_at_its_step(items, every, warned):
    """spatial_TL's projector output scaled by 1000 from step 3 on, in a custom loop: warned at step
    3 when every step is measured, at step 4 (the first measured after) every 2 steps."""
    model = fresh_model()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = {"now": 0}
    planted = model.model.spatial_projectors[0].register_forward_hook(_scaling(1e3, lambda: step["now"] >= 3))
    with DeepstackMonitor(model, MonitorSettings(every=every)) as monitor:
        for number in range(1, 6):
            step["now"] = number
            with monitor.step(number):
                model(**items[number % len(items)][2]).loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                monitor.gradients_ready()
                optimizer.step()
                optimizer.zero_grad()
    planted.remove()
    first = next(alert for record in monitor.history for alert in record.alerts)
    assert (first.step, first.level, first.kind) == (warned, "spatial_TL", EXPLOSION)


def test_a_lora_being_trained_has_its_update_norm_per_module_group(items):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(fresh_model(), LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                                     target_modules=r".*language_model.*\.(q_proj|v_proj|down_proj)"))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    lora = {name: p for name, p in model.named_parameters() if "lora_" in name}
    start = {name: p.detach().clone() for name, p in lora.items()}
    with DeepstackMonitor(model, MonitorSettings(every=2)) as monitor:
        for number in (1, 2):
            with monitor.step(number):
                model(**items[number][2]).loss.backward()
                monitor.gradients_ready()
                optimizer.step()
                optimizer.zero_grad()
            if number == 1:
                start = {name: p.detach().clone() for name, p in lora.items()}
    record = monitor.history[-1]
    assert sorted(record.lora) == ["down_proj", "q_proj", "v_proj"]
    for group, value in record.lora.items():
        expected = math.sqrt(sum(float(((p.detach() - start[n]) ** 2).sum()) for n, p in lora.items()
                                 if f".{group}.lora_" in n))
        assert value == pytest.approx(expected, rel=1e-5), group
    assert record.levels[0].injected_norm > 0 and record.to_logs()["lora/q_proj/update_norm"] == record.lora["q_proj"]


def test_a_probe_batch_is_measured_after_the_update(items):
    """With a probe, the forward numbers are the probe's on the weights after the step's update:
    the inspector's capture of the same model then reads the same."""
    from g4v.model.capture import capture_forward

    model = fresh_model()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = {k: v for k, v in items[1][2].items() if k != "labels"}
    with DeepstackMonitor(model, MonitorSettings(every=1), probe=probe) as monitor:
        with monitor.step(1):
            model(**items[0][2]).loss.backward()
            monitor.gradients_ready()
            optimizer.step()
    assert model.training  # put back as it was
    model.eval()
    capture, _ = capture_forward(model, probe)
    for cap, level in zip(capture.levels, monitor.history[0].levels):
        assert level.injected_norm == pytest.approx(cap.injected_norm_mean, **FLOAT32)


def test_measured_checkpoints_read_what_the_inspector_and_the_log_read(trained, items, tmp_path):
    """Without the log (``--measure``), each checkpoint is measured on the probe set: checkpoint 4's
    numbers are the inspector's on it, and its update norm the one logged at step 4 (checkpoint 3
    to 4: both are measured, so "since the last record" is the same span)."""
    from g4v.training.report import open_run

    run, history, _, _ = trained
    picture, prompt, _ = items[2]
    seen = []
    curves = open_run(run.folder.name, [run.folder.parent], measure=True, probe=[(picture, prompt)],
                      progress=lambda done, total, elapsed: seen.append((done, total)))
    assert [record.step for record in curves.records] == list(range(STEPS + 1))
    assert seen == [(done, STEPS + 1) for done in range(STEPS + 2)]
    expected = inspector_numbers(run.folder / f"checkpoint-{STEPS}", picture, prompt, tmp_path)
    for level, logged in zip(curves.records[-1].levels, history[-1].levels):
        assert level.injected_norm == pytest.approx(expected[level.name]["injected_norm"], **FLOAT32)
        assert level.ratio == pytest.approx(expected[level.name]["ratio"], **FLOAT32)
        assert level.update_norm == pytest.approx(logged.update_norm, rel=1e-5)
        assert level.grad_norm is None  # a checkpoint keeps no gradient


def test_the_command_and_the_tab_show_the_same_run(trained, capsys, tmp_path):
    import json

    import gradio as gr

    from g4v.cli import main as cli_main
    from g4v.training.report import summary_rows, open_run
    from webapp.training import RunBoxes, StepBoxes, make_handlers

    run, _, _, _ = trained
    assert cli_main(["training", run.folder.name, "--runs-dir", str(run.folder.parent), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    with gr.Blocks():
        boxes = RunBoxes(gr.Markdown(), gr.Dataframe(), gr.Image(), gr.Dropdown(), gr.Dropdown(), gr.State(), gr.JSON())
        steps = StepBoxes(gr.Dataframe(), gr.Image(), gr.Textbox(), gr.Textbox())
    open_run_view, open_steps_view = make_handlers(str(run.folder.parent), lambda fn: fn, boxes, steps)
    shown = open_run_view(run.folder.name)
    assert json.loads(json.dumps(shown[boxes.data])) == printed
    assert shown[boxes.table] == summary_rows(open_run(run.folder.name, [run.folder.parent]))
    assert f"{STEPS} records from the Trainer's trainer_state.json" in shown[boxes.status]
    # the same step in both boxes is refused before any checkpoint is loaded, naming the step
    with pytest.raises(gr.Error, match="step A and step B are both step 2: choose two different steps"):
        open_steps_view(run.folder.name, 2, 2, None, "")
    # a run that kept one checkpoint (its last): both boxes offer its step, and the refusal says why
    single = tmp_path / "kept-one"
    shutil.copytree(run.folder, single, ignore=lambda _, names: [n for n in names if n.startswith("checkpoint-")])
    last = max(run.folder.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    shutil.copytree(last, single / last.name)
    step = int(last.name.split("-")[1])
    open_run_view, open_steps_view = make_handlers(str(tmp_path), lambda fn: fn, boxes, steps)
    shown = open_run_view(single.name)
    assert shown[boxes.step_a]["value"] == shown[boxes.step_b]["value"] == step
    refusal = rf"this run kept one checkpoint \(step {step}\): the side-by-side view needs two"
    for asked in (step, step + 1):  # the step kept is named, whichever step both boxes ask for
        with pytest.raises(gr.Error, match=refusal):
            open_steps_view(single.name, asked, asked, None, "")
