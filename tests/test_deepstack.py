"""The deepstack inspector, checked against the model itself (bundled checkpoint, real config on meta)."""

import json
import zipfile

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import Granite4VisionForConditionalGeneration

from g4v.cli import main as cli_main
from g4v.conversation import Message, SamplingSettings
from g4v.errors import G4VError
from g4v.inspect.ablation import compare_scaled, run_outcome
from g4v.model.scoring import greedy_continuation, kl_divergence
from g4v.model.capture import capture_forward, instrument
from g4v.model.levels import describe_levels, find_level, level_scales, parse_scale_specs
from g4v.paths import BUNDLED_MODEL_DIR, REAL_CONFIG_DIR
from tests.conftest import make_image

PROMPT = "What is in the picture?"


@pytest.fixture(scope="module")
def image():
    return make_image(300, 140, seed=3)  # a 2 x 3 tile grid on the bundled checkpoint


@pytest.fixture(scope="module")
def inputs(hf_engine, image):
    return hf_engine.prepare_inputs([Message("user", PROMPT, [image])])


@pytest.fixture(scope="module")
def full_capture(hf_engine, inputs):
    """(capture, logits) of one instrumented pass with full tensors, no level modified."""
    return capture_forward(hf_engine.model, inputs, full=True)


def _hook_count(model) -> int:
    """Forward hooks on the model. transformers installs a few of its own (output capture), so tests
    compare counts before and after a call rather than expect zero."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@pytest.fixture(scope="module")
def hooks_at_rest(hf_engine):
    with torch.inference_mode():  # let transformers install its own output-capture hooks first
        hf_engine.model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    return _hook_count(hf_engine.model)


# ── levels from the config ─────────────────────────────────────────────────────────────────────


def test_real_config_layer_map_on_meta_device():
    from g4v.loading import load_config

    config = load_config(REAL_CONFIG_DIR)
    with torch.device("meta"):
        model = Granite4VisionForConditionalGeneration(config)
    levels = describe_levels(model.config)
    deepstack = [level for level in levels if level.kind == "deepstack"]
    spatial = [level for level in levels if level.kind == "spatial"]
    assert [level.llm_layer for level in deepstack] == [9, 6, 3, 0]
    assert [level.llm_layer for level in spatial] == [12, 15, 18, 21]
    assert [level.vision_layer for level in deepstack] == [-19, -13, -7, -1]
    assert [level.vision_hidden_state for level in deepstack] == [9, 15, 21, 27]  # 27 encoder layers
    assert [level.offset for level in spatial] == ["TL", "TR", "BL", "BR"]
    # The hooks fit this model's 40 layers, and all of them come off again.
    at_rest = _hook_count(model)
    with instrument(model, levels, scales={"spatial_BR": 0.0}, full=True):
        assert _hook_count(model) == at_rest + 1 + 1 + 2 * 40
    assert _hook_count(model) == at_rest


def test_level_lookup_and_one_line_errors(hf_engine):
    levels = describe_levels(hf_engine.model.config)
    assert find_level(levels, "SPATIAL_tl").name == "spatial_TL"
    assert find_level(levels, "3").name == "deepstack3"
    assert level_scales(levels, ["0"], {"spatial_BR": "0.5"}) == {"deepstack0": 0.0, "spatial_BR": 0.5}
    for bad in (lambda: find_level(levels, "deepstack9"), lambda: find_level(levels, 8),
                lambda: level_scales(levels, [], {"spatial_TL": "x"}),
                lambda: parse_scale_specs(["spatial_TL"]), lambda: parse_scale_specs(["a=b"])):
        with pytest.raises(G4VError) as err:
            bad()
        assert "\n" not in str(err.value)


# ── correctness against the model ──────────────────────────────────────────────────────────────


def test_captured_features_equal_get_image_features(hf_engine, inputs, full_capture):
    capture, _ = full_capture
    with torch.inference_mode():
        own = hf_engine.model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"]).deepstack_features
    assert len(own) == len(capture.levels) == 8
    for cap, (llm_layer, per_image) in zip(capture.levels, own):
        expected = torch.cat(per_image)  # (num_image_tokens, hidden)
        assert cap.level.llm_layer == llm_layer
        torch.testing.assert_close(cap.injected, expected, rtol=0, atol=0)
        torch.testing.assert_close(cap.injected_norm, expected.norm(dim=-1))
        assert cap.injected_norm_mean == pytest.approx(float(expected.norm(dim=-1).mean()), rel=1e-5)


def test_residual_after_minus_before_is_the_injection(full_capture):
    capture, _ = full_capture
    image = capture.image_mask
    assert capture.num_image_tokens == int(image.sum()) > 0 and capture.num_text_tokens > 0
    for cap in capture.levels:
        difference = cap.residual_after - cap.residual_before  # (seq, hidden)
        torch.testing.assert_close(difference[image], cap.injected, rtol=1e-5, atol=1e-5)
        assert torch.equal(cap.residual_after[~image], cap.residual_before[~image])  # text untouched
        assert cap.residual_norm_after_image == pytest.approx(float(cap.residual_after[image].norm(dim=-1).mean()), rel=1e-5)
        assert cap.residual_norm_before_text == pytest.approx(float(cap.residual_before[~image].norm(dim=-1).mean()), rel=1e-5)


def test_stream_matches_the_model_own_hidden_states(hf_engine, inputs, full_capture):
    capture, _ = full_capture
    layers = len(hf_engine.model.model.language_model.layers)
    with torch.inference_mode():
        hidden = hf_engine.model(**inputs, output_hidden_states=True).hidden_states  # layers + 1 tensors
    # transformers records hidden_states[0] = the stream entering layer 0 (after its injection) and,
    # for 0 < i < layers, hidden_states[i] = layer i-1's output = the stream entering layer i BEFORE
    # its injection (the last entry has the final norm applied, so it is left out).
    before_by_layer = {cap.level.llm_layer: cap.residual_before for cap in capture.levels}
    assert capture.residual_stream.shape[0] == layers + 1
    assert torch.equal(capture.residual_stream[0], hidden[0][0])
    for i in range(1, layers):
        expected = before_by_layer.get(i, capture.residual_stream[i])
        torch.testing.assert_close(expected, hidden[i][0], rtol=0, atol=0)
    levels = describe_levels(hf_engine.model.config)
    assert capture.trajectory.injection_layers == {level.llm_layer: level.name for level in levels}


def test_no_ablation_logits_equal_the_plain_forward_exactly(hf_engine, inputs, full_capture, hooks_at_rest):
    _, logits = full_capture
    with torch.inference_mode():
        plain = hf_engine.model(**inputs).logits
    assert torch.equal(logits, plain)
    assert _hook_count(hf_engine.model) == hooks_at_rest


def test_zeroing_all_levels_equals_the_model_without_image_features(hf_engine, inputs):
    model = hf_engine.model
    levels = describe_levels(model.config)
    capture, logits = capture_forward(model, inputs, scales={level.name: 0.0 for level in levels})
    # Without image features the model's forward only zeroes the placeholder embeddings
    # (Granite4VisionModel.forward), so feed it exactly that and no pixels.
    with torch.inference_mode():
        embeds = model.get_input_embeddings()(inputs["input_ids"])
        placeholders = (inputs["input_ids"] == model.config.image_token_id)[..., None]
        embeds = embeds.masked_fill(placeholders, 0.0)
        reference = model(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).logits
    torch.testing.assert_close(logits, reference, rtol=0, atol=0)
    assert all(float(cap.injected_norm.max()) == 0.0 for cap in capture.levels)


def test_scaling_one_level_changes_the_stream_from_its_layer_on(hf_engine, inputs, full_capture):
    base, _ = full_capture
    level = find_level(describe_levels(hf_engine.model.config), "spatial_TR")
    scaled, _ = capture_forward(hf_engine.model, inputs, scales={level.name: 2.0})
    torch.testing.assert_close(scaled.levels[level.index].injected_norm, 2 * base.levels[level.index].injected_norm)
    image_before, image_after = base.trajectory.image_norm, scaled.trajectory.image_norm
    assert image_after[: level.llm_layer] == pytest.approx(image_before[: level.llm_layer], rel=1e-6)
    assert image_after[level.llm_layer] != pytest.approx(image_before[level.llm_layer], rel=1e-4)


def test_ablation_report(hf_engine, inputs, hooks_at_rest):
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    _, logits = capture_forward(model, inputs, logits_to_keep=1)
    base = run_outcome(model, inputs, tokenizer, logits, max_new_tokens=4)
    assert float(kl_divergence(base.next_token_logprobs, base.next_token_logprobs)) == 0.0
    changed = compare_scaled(model, inputs, tokenizer, base, {"deepstack3": 0.0, "spatial_TL": 5.0}, max_new_tokens=4)
    expected_kl = torch.sum(base.next_token_probs * (base.next_token_probs / changed.after.next_token_probs).log())
    assert changed.kl_divergence == pytest.approx(float(expected_kl), rel=1e-2) and changed.kl_divergence > 0
    with torch.inference_mode():  # the greedy continuation is the model's own, under the same scaling
        first_new = greedy_continuation(model, inputs, tokenizer, 1, scales=changed.scales)
    assert changed.after.continuation_ids[:1] == first_new
    assert int(changed.after.next_token_probs.argmax()) == first_new[0] or tokenizer.eos_token_id == int(
        changed.after.next_token_probs.argmax())
    assert len(changed.before.top5) == len(changed.after.top5) == 5
    assert changed.before.top5[0].prob >= changed.before.top5[-1].prob
    assert changed.to_dict()["ablated"] == ["deepstack3"]
    assert _hook_count(model) == hooks_at_rest


# ── no leaks between requests ──────────────────────────────────────────────────────────────────


def test_requests_after_an_inspection_match_a_fresh_engine(hf_engine, inputs, hooks_at_rest):
    from g4v.engines.hf import TransformersEngine

    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    capture, logits = capture_forward(model, inputs, full=True, logits_to_keep=1)
    base = run_outcome(model, inputs, tokenizer, logits, max_new_tokens=0)
    compare_scaled(model, inputs, tokenizer, base, {"deepstack3": 0.0, "spatial_BL": 3.0}, max_new_tokens=2)
    assert _hook_count(model) == hooks_at_rest

    settings = SamplingSettings(max_new_tokens=6)
    text_only = [Message("user", "Say something.")]
    with_image = [Message("user", PROMPT, [make_image(300, 140, seed=3)])]
    fresh = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")
    assert hf_engine.generate(text_only, settings).token_ids == fresh.generate(text_only, settings).token_ids
    assert hf_engine.generate(with_image, settings).token_ids == fresh.generate(with_image, settings).token_ids


def test_hooks_come_off_when_the_forward_fails(hf_engine, hooks_at_rest):
    with pytest.raises(RuntimeError, match="boom"):
        with instrument(hf_engine.model, scales={"spatial_TL": 0.0}):
            assert _hook_count(hf_engine.model) > hooks_at_rest
            raise RuntimeError("boom")
    assert _hook_count(hf_engine.model) == hooks_at_rest


def test_run_inspection_for_the_app(hf_engine, image, tmp_path):
    from g4v.inspect.run import FIGURE_FILES, run_inspection

    result = run_inspection(hf_engine, image, PROMPT, max_new_tokens=0, out_dir=tmp_path / "export")
    assert result.ablation is None and result.to_dict()["ablation"] is None
    assert set(result.figures) == set(FIGURE_FILES) and all(f.width > 300 for f in result.figures.values())
    assert result.plan.num_image_tokens == result.capture.num_image_tokens
    names = set(zipfile.ZipFile(result.export_zip).namelist())
    assert {"summary.json", "capture.safetensors", *FIGURE_FILES.values()} <= names
    for kwargs in ({"ablate": ["deepstack7"]}, {"scale": {"spatial_TL": float("nan")}}):
        with pytest.raises(G4VError):
            run_inspection(hf_engine, image, PROMPT, **kwargs)
    with pytest.raises(G4VError):
        run_inspection(hf_engine, image, "   ")


# ── CLI and pictures ───────────────────────────────────────────────────────────────────────────


@pytest.mark.slow  # about 5 s on a quiet 2-core machine
def test_cli_writes_summary_pngs_and_capture(tmp_path, output_dir, image, capsys):
    image_path = tmp_path / "in.png"
    image.save(image_path)
    out = output_dir / "inspect"
    code = cli_main(["inspect", "--model", str(BUNDLED_MODEL_DIR), "--device", "cpu", "--dtype", "float32",
                     "--image", str(image_path), "--prompt", PROMPT, "--out", str(out),
                     "--ablate", "spatial_TL", "0", "--scale", "deepstack1=0.5", "--full", "--max-new-tokens", "4"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    names = ["deepstack0", "deepstack1", "deepstack2", "deepstack3", "spatial_TL", "spatial_TR", "spatial_BL", "spatial_BR"]
    assert [row["name"] for row in summary["levels"]] == names
    for row in summary["levels"]:
        assert row["kind"] in ("deepstack", "spatial")
        for key in ("vision_layer", "llm_layer", "injected_norm_mean", "residual_norm_before_mean",
                    "residual_norm_after_mean"):
            assert isinstance(row[key], (int, float))
        assert row["residual_norm_after_mean"] > 0 and row["injected_norm_mean"] > 0
    trajectory = summary["trajectory"]
    assert len(trajectory["image_norm"]) == len(trajectory["text_norm"]) == len(trajectory["layers"]) == 11
    assert sorted(int(k) for k in trajectory["injection_layers"]) == list(range(8))
    ablation = summary["ablation"]
    assert ablation["scales"] == {"spatial_TL": 0.0, "deepstack0": 0.0, "deepstack1": 0.5}
    assert ablation["kl_divergence"] >= 0 and len(ablation["top5_after"]) == 5
    for png in ("norms.png", "trajectory.png", "heatmaps_tiles.png", "heatmaps_base.png"):
        with Image.open(out / png) as picture:
            assert picture.width > 300 and picture.height > 200
            assert len(picture.convert("L").getcolors(1 << 16)) > 20  # something was drawn
    tensors = load_file(str(out / "capture.safetensors"))
    assert tensors["spatial_BR.injected"].shape == (summary["num_image_tokens"], 128)
    assert tensors["residual_stream"].shape[0] == 11
    assert float(tensors["ablated.spatial_TL.injected_norm"].abs().max()) == 0.0
    assert "spatial_TL" in capsys.readouterr().out

    assert cli_main(["inspect", "--image", str(image_path), "--prompt", PROMPT, "--out", str(out),
                     "--ablate", "spatial_XX"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown level 'spatial_XX'") and err.count("\n") == 1


def test_heatmap_paints_each_token_box():
    from viz.figures import paint_token_values

    heat = paint_token_values((10, 6), [(0, 0, 5, 3), (5, 0, 10, 3), (0, 3, 10, 3)], [1.0, 2.0, 9.0])
    assert heat.shape == (6, 10)
    assert (heat[:3, :5] == 1.0).all() and (heat[:3, 5:] == 2.0).all()
    assert torch.isnan(torch.from_numpy(heat[3:])).all()  # the empty (padding) box paints nothing
