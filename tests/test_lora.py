"""The LoRA workbench on the transformers engine: adapters per request, side by side, token-level
differences, and the merged checkpoint, each checked against PEFT's own adapter-attached model."""

import json
import shutil

import numpy as np
import pytest
import torch
from tests.conftest import make_image
from peft import PeftModel
from safetensors import safe_open

from g4v.conversation import Message, SamplingSettings
from g4v.demo.adapter import ADAPTER_NAME
from g4v.engines.hf import TransformersEngine
from g4v.errors import G4VError
from g4v.loading import load_model
from g4v.lora.folders import CONFIG_FILE
from g4v.lora.activation import activate_adapter
from g4v.lora.choices import adapter_choices
from g4v.lora.settings import LoraDiffSettings
from g4v.lora.side_by_side import lora_side_by_side, stream_side_by_side
from g4v.lora.token_diff import lora_diff, lora_token_diff
from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR

DEMO = ASSETS_DIR / "adapters" / ADAPTER_NAME
MODEL = str(BUNDLED_MODEL_DIR)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat():
    return [Message("user", "What is in this picture?", [make_image(200, 150, seed=3)])]


@pytest.fixture(scope="module")
def base_reference(chat):
    """Outputs of an engine that has never seen an adapter."""
    engine = TransformersEngine(MODEL, device="cpu", dtype="float32")
    greedy = engine.generate(chat, SamplingSettings(max_new_tokens=16))
    sampled = engine.generate(chat, SamplingSettings(max_new_tokens=16, temperature=0.9, seed=11))
    return greedy, sampled, forward_logits(engine.model, engine.prepare_inputs(chat))


@pytest.fixture(scope="module")
def engine(base_reference):
    """An engine of its own (the session engine stays adapter-free), with the demo adapter."""
    engine = TransformersEngine(MODEL, device="cpu", dtype="float32")
    activate_adapter(engine, ADAPTER_NAME)
    return engine


@pytest.fixture(scope="module")
def peft_reference():
    """The reference: a separately loaded base model with the demo adapter attached by PEFT."""
    return PeftModel.from_pretrained(load_model(MODEL, device="cpu", dtype="float32").model, str(DEMO)).eval()


def forward_logits(model, inputs) -> torch.Tensor:
    with torch.inference_mode():
        return model(**inputs).logits[0].float()


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


# ── the engine with adapters ───────────────────────────────────────────────────────────────────


def test_base_outputs_are_bit_identical_with_an_adapter_loaded(engine, chat, base_reference):
    greedy, sampled, logits = base_reference
    assert engine.adapters() == [ADAPTER_NAME]
    assert engine.model is engine.loaded.model  # no PEFT wrapper in between
    assert engine.generate(chat, SamplingSettings(max_new_tokens=16)).token_ids == greedy.token_ids
    assert engine.generate(chat, SamplingSettings(max_new_tokens=16, temperature=0.9, seed=11)).token_ids == sampled.token_ids
    assert torch.equal(forward_logits(engine.model, engine.prepare_inputs(chat)), logits)


def test_adapter_requests_match_peft(engine, chat, peft_reference, base_reference):
    inputs = engine.prepare_inputs(chat)
    with engine.adapter_scope(ADAPTER_NAME) as model:
        ours = forward_logits(model, inputs)
    expected = forward_logits(peft_reference, inputs)
    assert relative_error(ours, expected) < 1e-5
    assert relative_error(base_reference[2], expected) > 1e-2  # the adapter does change the model
    adapted = engine.generate(chat, SamplingSettings(max_new_tokens=16), adapter=ADAPTER_NAME)
    assert adapted.token_ids != base_reference[0].token_ids


def test_unknown_adapter_name_is_refused(engine, chat):
    with pytest.raises(G4VError, match="unknown adapter 'other'"):
        engine.generate(chat, SamplingSettings(max_new_tokens=2), adapter="other")


# ── side by side ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("settings", [SamplingSettings(max_new_tokens=20),
                                      SamplingSettings(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=5)])
def test_side_by_side_equals_separate_runs(engine, chat, settings, concurrent):
    updates = list(stream_side_by_side(engine, chat, settings, ADAPTER_NAME, concurrent=concurrent))
    final = updates[-1]
    assert final.base_done and final.adapter_done
    base = engine.generate(chat, settings)
    adapted = engine.generate(chat, settings, adapter=ADAPTER_NAME)
    assert final.base == base.text
    assert final.adapter == adapted.text
    assert engine.tokenizer(final.adapter, add_special_tokens=False).input_ids == engine.tokenizer(
        adapted.text, add_special_tokens=False).input_ids
    assert final.base != final.adapter
    assert len(updates) > 2  # it streamed, not one block at the end


def test_side_by_side_can_be_closed_early(engine, chat):
    stream = stream_side_by_side(engine, chat, SamplingSettings(max_new_tokens=200), ADAPTER_NAME)
    next(stream)
    stream.close()  # both requests stop and release the engine
    assert engine.generate(chat, SamplingSettings(max_new_tokens=3)).finish_reason in ("length", "stop")


# ── token-level differences ────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def diff(engine, chat):
    return lora_diff(engine, chat, ADAPTER_NAME, SamplingSettings(max_new_tokens=12))


def by_hand(logits_base: np.ndarray, logits_adapter: np.ndarray, token: int) -> dict:
    """log-softmax and KL written out from the raw logits, in float64."""

    def log_softmax(logits):
        top = logits.max()
        return logits - (top + np.log(np.exp(logits - top).sum()))

    lp_base, lp_adapter = log_softmax(logits_base), log_softmax(logits_adapter)
    return {
        "logprob_base": lp_base[token],
        "logprob_adapter": lp_adapter[token],
        "delta": lp_adapter[token] - lp_base[token],
        "kl": float(np.sum(np.exp(lp_adapter) * (lp_adapter - lp_base))),
        "greedy_base": int(lp_base.argmax()),
        "greedy_adapter": int(lp_adapter.argmax()),
    }


def test_one_position_by_hand(engine, chat, diff, peft_reference):
    """Recompute one position of the adapter's answer from logits of independent forward passes
    (one pass over prompt + answer prefix, base model and the PEFT reference)."""
    tokens = diff.tuned.tokens
    image_token = engine.model.config.image_token_index
    position = max(k for k in range(min(4, len(tokens))) if image_token not in [t.token_id for t in tokens[:k]])
    inputs = engine.prepare_inputs(chat)
    prefix = torch.tensor([[t.token_id for t in tokens[:position]]], dtype=inputs["input_ids"].dtype)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], prefix], dim=1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    with peft_reference.disable_adapter():
        logits_base = forward_logits(peft_reference, inputs)[-1].double().numpy()
    logits_adapter = forward_logits(peft_reference, inputs)[-1].double().numpy()

    expected = by_hand(logits_base, logits_adapter, tokens[position].token_id)
    entry = tokens[position]
    assert entry.position == position
    for key in ("logprob_base", "logprob_adapter", "delta", "kl"):
        assert getattr(entry, key) == pytest.approx(expected[key], abs=2e-4), key
    assert (entry.greedy_base, entry.greedy_adapter) == (expected["greedy_base"], expected["greedy_adapter"])


def test_greedy_choices_reproduce_each_answer(diff):
    """Teacher forcing replays generation: each greedy answer is its own model's argmax path."""
    assert [t.greedy_base for t in diff.base.tokens] == [t.token_id for t in diff.base.tokens]
    assert [t.greedy_adapter for t in diff.tuned.tokens] == [t.token_id for t in diff.tuned.tokens]
    base_ids = [t.token_id for t in diff.base.tokens]
    tuned_ids = [t.token_id for t in diff.tuned.tokens]
    common = next(i for i, (a, b) in enumerate(zip(base_ids, tuned_ids)) if a != b)
    assert diff.first_divergence == common
    assert all(t.kl >= 0 for t in diff.base.tokens + diff.tuned.tokens)


def test_diff_json_and_pictures(diff, output_dir):
    from viz.figures import figure_to_image
    from viz.lora import diff_html, diff_plot, diff_png

    data = json.loads(json.dumps(diff.to_dict()))
    assert {"base_text", "adapter_text", "first_divergence", "base_tokens", "adapter_tokens"} <= set(data)
    assert data["base_text"] == diff.base.text and len(data["adapter_tokens"]) == len(diff.tuned.tokens)
    html = diff_html(diff)
    assert html.count("<span") == len(data["base_tokens"]) + len(data["adapter_tokens"])
    assert "#1f4fd1" in html  # the first divergence is marked
    picture = diff_png(diff)
    plot = figure_to_image(diff_plot(diff))
    assert picture.size[0] == 900 and plot.size[0] > 400
    picture.save(output_dir / "lora_diff.png")
    plot.save(output_dir / "lora_diff_plot.png")


# ── the app's functions ────────────────────────────────────────────────────────────────────────


def test_app_functions(engine, chat):
    assert ADAPTER_NAME in adapter_choices()
    pairs = list(lora_side_by_side(engine, ADAPTER_NAME, chat[0].text, chat[0].images, SamplingSettings(max_new_tokens=8)))
    assert pairs[-1] == (engine.generate(chat, SamplingSettings(max_new_tokens=8)).text,
                         engine.generate(chat, SamplingSettings(max_new_tokens=8), adapter=ADAPTER_NAME).text)
    view = lora_token_diff(engine, chat[0].text, chat[0].images, LoraDiffSettings(adapter=ADAPTER_NAME, max_new_tokens=6))
    data = view.diff.to_dict()
    assert view.diff.adapter == data["adapter"] == ADAPTER_NAME and "<span" in view.html and view.figure.axes
    direct = lora_diff(engine, chat, ADAPTER_NAME, SamplingSettings(max_new_tokens=6)).to_dict()  # the same request, by hand
    assert [data[key] for key in ("base_text", "adapter_text", "base_tokens", "adapter_tokens")] \
        == [direct[key] for key in ("base_text", "adapter_text", "base_tokens", "adapter_tokens")]


def test_bad_adapters_leave_the_engine_serving(engine, chat, tmp_path):
    root = tmp_path / "adapters"
    shutil.copytree(DEMO, root / "broken")
    (root / "broken" / CONFIG_FILE).write_text("{ not json")
    shutil.copytree(DEMO, tmp_path / "outside")
    before = engine.generate(chat, SamplingSettings(max_new_tokens=8), adapter=ADAPTER_NAME)
    for choice in ["broken", str(tmp_path / "outside"), "missing"]:
        with pytest.raises(G4VError):
            list(lora_side_by_side(engine, choice, "Hi", (), adapters_dir=str(root)))
    assert engine.adapters() == [ADAPTER_NAME]
    assert engine.generate(chat, SamplingSettings(max_new_tokens=8), adapter=ADAPTER_NAME).token_ids == before.token_ids


# ── merge ──────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    from g4v.cli import main

    out = tmp_path_factory.mktemp("merge") / "merged"
    assert main(["merge-lora", "--model", MODEL, "--adapter", ADAPTER_NAME, "--out", str(out)]) == 0
    return out


def test_merged_checkpoint_layout(merged):
    for name in ["config.json", "generation_config.json", "processor_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja"]:
        assert (merged / name).is_file(), name
    assert (merged / "tokenizer.json").read_bytes() == (BUNDLED_MODEL_DIR / "tokenizer.json").read_bytes()
    assert json.loads((merged / "config.json").read_text())["dtype"] == "float32"
    with safe_open(str(merged / "model.safetensors"), "pt") as new, \
            safe_open(str(BUNDLED_MODEL_DIR / "model.safetensors"), "pt") as old:
        assert set(new.keys()) == set(old.keys())  # hub layout, vision tower under vision_model
        assert any(k.startswith("model.vision_tower.vision_model.") for k in new.keys())
        assert new.get_tensor("model.language_model.layers.0.self_attn.q_proj.weight").dtype == torch.float32


def test_merged_logits_equal_base_with_adapter(merged, chat, peft_reference):
    merged_model = load_model(str(merged), device="cpu", dtype="float32")
    engine = TransformersEngine(str(merged), loaded=merged_model)
    inputs = engine.prepare_inputs(chat)
    expected = forward_logits(peft_reference, inputs)
    assert relative_error(forward_logits(merged_model.model, inputs), expected) < 1e-4
    # The reason the merge is stored in float32: bf16 rounding loses the 1e-4 agreement.
    rounded = load_model(str(merged), device="cpu", dtype="bfloat16").model.float()
    inputs_bf16 = {k: (v.float() if k == "pixel_values" else v) for k, v in inputs.items()}
    assert relative_error(forward_logits(rounded, inputs_bf16), expected) > 1e-4


def test_merge_refuses_bad_requests(tmp_path, merged):
    from g4v.lora.merge import merge_lora

    with pytest.raises(G4VError, match="not empty"):
        merge_lora(MODEL, ADAPTER_NAME, merged)
    shutil.copytree(DEMO, tmp_path / "outside")
    with pytest.raises(G4VError, match="outside the adapter folders"):
        merge_lora(MODEL, str(tmp_path / "outside"), tmp_path / "out")


def test_lora_diff_command_json(capsys):
    from g4v.cli import main

    image = make_image(120, 90)
    path = ASSETS_DIR.parent / "test-output" / "lora_cli.png"
    path.parent.mkdir(exist_ok=True)
    image.save(path)
    status = main(["lora-diff", "--adapter", ADAPTER_NAME, "--image", str(path), "--prompt", "Describe it.",
                   "--max-new-tokens", "6", "--json", "--device", "cpu", "--dtype", "float32"])
    assert status == 0
    data = json.loads(capsys.readouterr().out)
    assert {"base_text", "adapter_text", "first_divergence", "base_tokens", "adapter_tokens"} <= set(data)
    assert {"logprob_base", "logprob_adapter", "delta", "kl"} <= set(data["adapter_tokens"][0])


def test_lora_diff_report_keeps_every_tokens_quotes(capsys):
    """Issue 31, item 11: the text table cut a token's repr at 16 characters, dropping its closing
    quote. Every token cell now reads back (``ast.literal_eval``) as the token or a shortened one."""
    import ast

    from g4v.cli import main
    from g4v.commands.lora_diff import TOKEN_WIDTH, _quoted

    # Written out by hand: 16 characters, 13 letters of the token, an ellipsis, both quotes.
    assert _quoted("abcdefghijklmnopqrstuvwxyz") == "'abcdefghijklm…'"
    assert _quoted(" red") == "' red'"

    path = ASSETS_DIR.parent / "test-output" / "lora_cli_text.png"
    path.parent.mkdir(exist_ok=True)
    make_image(120, 90).save(path)
    assert main(["lora-diff", "--adapter", ADAPTER_NAME, "--image", str(path), "--prompt", "Describe it.",
                 "--max-new-tokens", "6", "--device", "cpu", "--dtype", "float32"]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line[:8].strip().isdigit()]
    assert rows
    for row in rows:
        cell = row[8 : 8 + TOKEN_WIDTH].rstrip()
        token = ast.literal_eval(cell)  # a whole Python string: both quotes there
        assert isinstance(token, str) and len(cell) <= TOKEN_WIDTH

    with pytest.raises(SystemExit):
        main(["lora-diff", "--help"])
    shown = capsys.readouterr().out
    usage = " ".join(shown.split("\n\n")[0].split())  # argparse's usage block, its wrapping undone
    assert shown.count("usage:") == 1 and "--image PATH" in usage and "[--image PATH" not in usage
    assert "[--png PATH] [--plot PATH]" in usage
