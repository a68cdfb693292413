"""The port inspector on the layout checkpoint (base weights with the vision LoRA beside them).

With the vision LoRA applied on both sides (transformers native or merged, vLLM native through
``default_mm_loras`` as ``LLM.generate`` applies it) every level, the trajectory and the logits
agree: OK. Under each serving mistake the audit gives its one-line finding and the verdict is
DIFFERS; vLLM is started with exactly the mistaken arguments, and its greedy tokens are checked
against the base language model answered by transformers (``vision-lora=off``), so the finding is
backed by what vLLM really served, not only by reading the settings.

vLLM starts four times here (one probe for the module, three mistaken ones).
"""

import pytest

from g4v.conversation import Message, SamplingSettings
from g4v.demo import shapes as S
from g4v.paths import VLORA_MODEL_DIR
from tests.cli import run_cli

pytestmark = pytest.mark.vllm

LAYOUT = str(VLORA_MODEL_DIR)
PICTURE = S.eval_set(1)[0]
QUESTION = PICTURE.qas[0].question  # the colour question: the base language model answers it wrong
TOKENS = 4


@pytest.fixture(scope="module")
def engines():
    from g4v.engines.hf import TransformersEngine

    return {mode: TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora=mode)
            for mode in ("native", "merged", "off")}


@pytest.fixture(scope="module")
def answers(engines) -> dict:
    """Greedy token ids per mode, from the engines (not from the port inspector)."""
    settings = SamplingSettings(max_new_tokens=TOKENS, temperature=0)
    found = {mode: engine.generate([Message("user", QUESTION, [PICTURE.image])], settings).token_ids
             for mode, engine in engines.items()}
    assert found["native"] != found["off"], "the picture must tell the vision model from the base"
    return found


@pytest.fixture(scope="module")
def probe():
    from g4v.port.probe import VLLMProbe

    with VLLMProbe(LAYOUT) as started:
        yield started


def diff(**options):
    from g4v.port.run import run_port_diff

    return run_port_diff(PICTURE.image, QUESTION, max_new_tokens=TOKENS, **options).summary.to_dict()


@pytest.mark.parametrize("mode", ["native", "merged"])
def test_the_vision_lora_on_both_sides_matches(engines, answers, probe, mode):
    summary = diff(hf_engine=engines[mode], probe=probe)
    assert summary["ok"], summary["message"]
    assert summary["vision_lora"]["findings"] == [] and summary["vision_lora"]["vllm_applies"]
    assert summary["trajectory"]["ok"] and all(level["ok"] for level in summary["levels"])
    assert summary["next_token"]["continuation_ids_vllm"] == answers["native"]


def test_vision_lora_off_on_one_side_is_a_finding(engines, probe):
    summary = diff(hf_engine=engines["off"], probe=probe)
    assert not summary["ok"]
    [finding] = summary["vision_lora"]["findings"]
    assert finding.startswith("transformers does not apply the checkpoint's vision LoRA") and "\n" not in finding
    assert "vision LoRA native or merged" in finding and finding in summary["message"]


@pytest.mark.parametrize("serving, words", [
    ({}, "vLLM does not apply the checkpoint's vision LoRA (enable_lora is off)"),
    ({"hf_overrides": {"adapter_path": LAYOUT}}, "hf_overrides adapter_path is read by no code"),
])
def test_a_vllm_that_serves_the_base_is_a_finding(engines, answers, serving, words):
    summary = diff(hf_engine=engines["native"], vllm_serving=serving)
    assert not summary["ok"] and summary["vllm_error"] is None
    assert any(line.startswith(words) for line in summary["vision_lora"]["findings"]), summary["vision_lora"]
    assert all("\n" not in line and "merge-lora" in line for line in summary["vision_lora"]["findings"])
    assert summary["next_token"]["continuation_ids_vllm"] == answers["off"]  # what vLLM really served


def test_a_max_lora_rank_below_the_adapters_is_a_finding_from_the_cli(tmp_path):
    serving = '{"enable_lora": true, "max_lora_rank": 8, "default_mm_loras": {"image": "%s"}}' % LAYOUT
    PICTURE.image.save(tmp_path / "picture.png")
    done = run_cli("port-diff", "--model", LAYOUT, "--image", str(tmp_path / "picture.png"), "--prompt", QUESTION, "--max-new-tokens", str(TOKENS),
                   "--vllm-serving", serving, "--fail-on-diff")
    assert done.returncode == 3, done.stderr[-2000:]
    assert "verdict: DIFFERS" in done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith("finding: ")]
    assert lines == ["finding: max_lora_rank 8 is below the vision LoRA's rank 16: vLLM refuses to load it and "
                     "image requests fail (compared here without it); use --max-lora-rank 16"]


def test_bad_serving_arguments_are_one_line():
    done = run_cli("port-diff", "--model", LAYOUT, "--image", "x.png", "--prompt", "hi",
                   "--vllm-serving", '{"max_lora_rank": "big"}')
    assert done.returncode == 1 and done.stderr.strip() == "error: --vllm-serving: max_lora_rank must be a whole number"

