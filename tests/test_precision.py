"""Precision arms (``g4v.model.precision``) on the bundled checkpoint: bfloat16 and int8 weights
against float32, with real transformers models and real torchao quantization.

The bfloat16 drift is checked against an independent computation: the float32 model cast to
bfloat16 here, its injected features read with a plain forward pre-hook (not the capture layer),
and the relative error and cosine computed in numpy float64."""

import copy
import json

import numpy as np
import pytest
import torch

from g4v.conversation import Message
from g4v.engines.hf import TransformersEngine
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.model.precision import (Precision, check_precision, drift_summary, is_int8, is_vision_module,
                                 precision_drift, quantized_layers)
from g4v.paths import BUNDLED_MODEL_DIR, REPO_ROOT

PICTURE = REPO_ROOT / "assets" / "examples" / "shapes-square.png"


@pytest.fixture(scope="module")
def messages():
    return [Message("user", "What colour is the square?", [open_image(PICTURE)])]


@pytest.fixture(scope="module")
def float32_engine():
    """A float32 reference of this module's own: the session's shared engine may carry adapters
    another test loaded (PEFT wraps its linear layers), and the weights here are compared by name."""
    return TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def bf16_engine():
    return TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="bfloat16")


def plain_linears(model) -> dict[str, torch.nn.Linear]:
    return {name: module for name, module in model.named_modules()
            if type(module) is torch.nn.Linear and "lora_" not in name}


def hooked_features(model, inputs) -> dict[int, np.ndarray]:
    """What the language model is handed to inject, by LLM layer, read by a hook of this test's own."""
    seen = {}

    def hook(module, args, kwargs):
        seen.update({layer: features.float().numpy().astype(np.float64)
                     for layer, features in (kwargs.get("deepstack_features") or {}).items()})

    handle = model.model.language_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(**inputs)
    finally:
        handle.remove()
    return seen


def test_float32_against_float32_drifts_by_exactly_zero(float32_engine, messages):
    other = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")  # loaded on its own
    report = precision_drift(float32_engine, other, messages, Precision(), Precision("float32"))
    assert len(report.levels) == 8
    for level in report.levels:
        assert level.rel_error == 0.0 and level.max_abs_diff == 0.0 and level.cosine == pytest.approx(1.0, abs=1e-12)
    assert report.next_token_kl == 0.0 and report.argmax_agrees


def test_bfloat16_drift_equals_a_cast_done_here(float32_engine, bf16_engine, messages):
    report = precision_drift(float32_engine, bf16_engine, messages, Precision(), Precision("bfloat16"))
    cast = copy.deepcopy(float32_engine.model).to(torch.bfloat16)
    inputs = dict(float32_engine.prepare(messages).inputs)
    reference = hooked_features(float32_engine.model, inputs)
    got = hooked_features(cast, {**inputs, "pixel_values": inputs["pixel_values"].to(torch.bfloat16)})
    assert sorted(reference) == sorted(level.llm_layer for level in report.levels)
    for level in report.levels:
        ref, new = reference[level.llm_layer], got[level.llm_layer]
        rel = np.linalg.norm(new - ref) / np.linalg.norm(ref)
        cosine = np.mean((new * ref).sum(-1) / (np.linalg.norm(new, axis=-1) * np.linalg.norm(ref, axis=-1)))
        assert rel > 1e-4  # bfloat16 really moved the features
        assert level.rel_error == pytest.approx(rel, rel=1e-5)
        assert 1 - level.cosine == pytest.approx(1 - cosine, rel=1e-4)
        assert level.max_abs_diff == pytest.approx(np.abs(new - ref).max(), rel=1e-5)
    assert report.next_token_kl > 0.0


def test_int8_quantizes_every_linear_layer(float32_engine, messages):
    engine = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32", quant="int8")
    linears = plain_linears(engine.model)
    assert sorted(quantized_layers(engine.model)) == sorted(linears)
    reference = plain_linears(float32_engine.model)
    for name, module in linears.items():
        weight = module.weight
        assert type(weight).__name__ == "Int8Tensor" and weight.qdata.dtype == torch.int8
        original = reference[name].weight.detach()
        # symmetric per output channel over int8's 255 steps: scale = max |w| / 127.5, and every
        # weight comes back within half a step of itself
        scale = original.abs().amax(dim=1, keepdim=True) / 127.5
        assert torch.allclose(weight.scale.reshape(-1, 1).float(), scale, rtol=1e-5)
        assert ((weight.dequantize().float() - original).abs() <= scale * (0.5 + 1e-4)).all()
        assert not torch.equal(weight.dequantize().float(), original)
    report = precision_drift(float32_engine, engine, messages, Precision(), Precision(quant="int8"))
    assert report.quantized_layers == len(linears)
    assert all(0 < level.rel_error < 0.1 for level in report.levels)


def test_int8_keeps_the_vision_part_when_asked(float32_engine, messages):
    engine = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32", quant="int8",
                                quant_vision=False)
    reference = plain_linears(float32_engine.model)
    vision = [name for name in reference if is_vision_module(name)]
    assert vision and any(name.startswith("model.vision_tower.") for name in vision)
    assert any("projectors" in name for name in vision)
    for name, module in plain_linears(engine.model).items():
        if is_vision_module(name):  # kept: a plain float32 weight, equal to the reference's
            assert not is_int8(module.weight) and module.weight.dtype == torch.float32
            assert torch.equal(module.weight, reference[name].weight)
        else:
            assert is_int8(module.weight)
    assert "vision tower and projectors kept" in engine.info.details["quant"]
    report = precision_drift(float32_engine, engine, messages, Precision(), Precision(quant="int8", quant_vision=False))
    # the injected features come out of the vision part only: kept, they do not move at all
    assert all(level.rel_error == 0.0 for level in report.levels)
    assert report.next_token_kl > 0.0  # the language model's int8 weights still move the answer


@pytest.mark.parametrize("values, message", [
    ({"dtype": "int4"}, "dtype must be one of float32, bfloat16, float16, got 'int4'"),
    ({"quant": "int4"}, "quant must be int8 (torchao int8 weight-only), got 'int4'"),
    ({"quant": "int8", "quant_vision": "maybe"}, "quant-vision must be yes or no, got 'maybe'"),
    ({"quant_vision": "no"}, "quant-vision= says what quant= does to the vision part: give quant=int8 with it"),
])
def test_bad_precision_is_one_line(values, message):
    with pytest.raises(G4VError) as err:
        check_precision(**values)
    assert str(err.value) == message


def test_precision_names_and_aliases():
    assert check_precision("bf16") == Precision("bfloat16")
    assert check_precision(quant="INT8", quant_vision="no") == Precision(quant="int8", quant_vision=False)
    assert Precision(quant="int8", quant_vision=False).label == "int8 weights, vision kept in float32"


def test_drift_summary_means_over_rows():
    rows = [{"levels": {"deepstack0": {"rel_error": 0.01, "cosine": 0.999}}, "next_token_kl": 0.002},
            {"levels": {"deepstack0": {"rel_error": 0.03, "cosine": 0.997}}, "next_token_kl": 0.004}]
    summary = drift_summary(rows)
    level = summary.levels["deepstack0"]
    assert level.rel_error_mean == pytest.approx(0.02) and level.rel_error_max == 0.03
    assert level.cosine_mean == pytest.approx(0.998) and level.cosine_min == 0.997
    assert summary.next_token_kl_mean == pytest.approx(0.003) and summary.n == 2
    assert drift_summary([]) is None


def test_cli_prints_the_drift_the_library_computes(float32_engine, bf16_engine, messages):
    from tests.cli import run_cli

    result = run_cli("precision", "--model", str(BUNDLED_MODEL_DIR), "--image", str(PICTURE),
                     "--prompt", "What colour is the square?", "--dtype", "bf16", "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    expected = precision_drift(float32_engine, bf16_engine, messages, Precision("float32"), Precision("bfloat16"))
    assert printed["candidate"]["dtype"] == "bfloat16" and len(printed["levels"]) == 8
    for row, level in zip(printed["levels"], expected.levels):
        assert row["name"] == level.name and row["rel_error"] == pytest.approx(level.rel_error, rel=1e-12)
    assert printed["next_token_kl"] == pytest.approx(expected.next_token_kl, rel=1e-9)
    text = run_cli("precision", "--model", str(BUNDLED_MODEL_DIR), "--image", str(PICTURE), "--prompt", "colour?")
    assert text.returncode == 0 and text.stdout.startswith("bfloat16 against float32")  # bf16 is the default
    assert sum(line.startswith(("deepstack", "spatial_")) for line in text.stdout.splitlines()) == 8


def test_cli_no_quant_vision_without_quant_is_refused():
    """``--no-quant-vision`` alone was taken and meant nothing (bfloat16 ran, nothing quantized)."""
    from tests.cli import run_cli

    result = run_cli("precision", "--image", str(PICTURE), "--prompt", "colour?", "--no-quant-vision")
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "error: --no-quant-vision says what --quant does to the vision part: give --quant int8 with it"]


@pytest.mark.parametrize("flags, message", [
    (["--dtype", "int4"], "error: dtype must be one of float32, bfloat16, float16, got 'int4'"),
    (["--quant", "int2"], "error: quant must be int8 (torchao int8 weight-only), got 'int2'"),
    (["--image", "missing.png"], "error: image not found: missing.png"),
])
def test_cli_bad_input_is_one_line(flags, message):
    from tests.cli import run_cli

    args = {"--image": str(PICTURE), "--prompt": "colour?"}
    for flag, value in zip(flags[::2], flags[1::2]):
        args[flag] = value
    result = run_cli("precision", *[part for pair in args.items() for part in pair])
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [message]


@pytest.mark.slow  # starts python -m g4v or python itself
def test_torchao_adds_no_lines_to_a_model_load():
    """transformers imports torchao on its own once it is installed; its kernel-library warnings and
    torch's enum warnings are filtered (``g4v/__init__.py``), so a load prints only its progress."""
    import os
    import subprocess
    import sys

    code = ("from g4v.engines.hf import TransformersEngine; import sys; "
            f"TransformersEngine({str(BUNDLED_MODEL_DIR)!r}, device='cpu', dtype='float32', quant='int8'); "
            "print('torchao' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert "Failed to load" not in done.stderr and "Enum subclass" not in done.stderr


def test_int8_leaves_a_native_vision_lora_in_float32(messages):
    """On the layout checkpoint (base + vision LoRA, native mode) the base layers are quantized and
    the LoRA matrices PEFT adds on top stay float32; the quantized model still answers."""
    from g4v.conversation import SamplingSettings
    from g4v.paths import VLORA_MODEL_DIR

    engine = TransformersEngine(str(VLORA_MODEL_DIR), device="cpu", dtype="float32", quant="int8")
    assert engine.vision_mode == "native"
    names = quantized_layers(engine.model)
    assert any(name.endswith("q_proj.base_layer") for name in names)
    lora = [(name, module) for name, module in engine.model.named_modules()
            if type(module) is torch.nn.Linear and "lora_" in name]
    assert lora and all(not is_int8(module.weight) and module.weight.dtype == torch.float32 for _, module in lora)
    assert engine.generate(messages, SamplingSettings(max_new_tokens=3)).token_ids
