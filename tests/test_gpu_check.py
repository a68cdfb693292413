"""The GPU check's CPU smoke run (``scripts/gpu_check.sh --cpu-smoke``): every step of the GPU run,
on the CPU, with the real model's geometry (layer counts, level map, 27 pinpoints, 384-pixel tiles,
so the real image-token counts) and narrow widths. It keeps the script from rotting before a GPU
is lent; the GPU run itself is documented in docs/gpu_check.md.

The expected numbers come from elsewhere: the real config file, the tiling plan, and the issue's
own count (a 768 x 1536 picture is 1320 image tokens on the real model)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from g4v.loading import read_raw_config
from g4v.paths import REAL_CONFIG_DIR, REPO_ROOT
from tests.conftest import once_per_run
from tests.gpu_machine import machine

pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO_ROOT / "scripts"))


def smoke_run(out: Path) -> dict:
    """The smoke run with what the GPU machine lacks made unimportable (tests/gpu_machine)."""
    done = subprocess.run([str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--cpu-smoke", str(out)],
                          capture_output=True, text=True, timeout=600, env=machine.environment())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "gpu_check.json").read_text())
    data["table"] = (out / "gpu_check.txt").read_text()
    return data


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """One smoke run for the whole test run (about 3 minutes), however many workers draw these tests."""
    return once_per_run(tmp_path_factory, "gpu-check", smoke_run)


def steps(report) -> dict:
    return {step["name"]: step for step in report["steps"]}


def timed(rate: float) -> bool:
    """A decode rate the smoke run measured: positive, or NaN where the engine's reader got each of
    the answer's few tokens after the first in one piece with it, in every round, so no time passed
    between two of them (:func:`g4v.engines.decode_bench.decode_rates`); never zero or negative."""
    return rate > 0 or rate != rate


def test_every_step_runs_or_says_why_not(report):
    from gpu_check_steps import STEPS

    by_name = steps(report)
    assert list(by_name) == [name for name, _ in STEPS()]
    for name, step in by_name.items():
        assert step["status"] in ("ok", "skipped"), (name, step["error"], step["metrics"].get("traceback"))
        if step["status"] == "skipped":
            assert step["error"] or step["metrics"].get("reason"), name
        assert name in report["table"]
    assert {name for name, step in by_name.items() if step["status"] == "ok"} >= {
        "load", "chat", "deepstack_capture", "deepstack_ablation", "tiling_27_pinpoints", "attribution", "documents",
        "dataset_run", "dataset_batching", "circuits", "vision_lora", "lora"}
    assert "CUDA" in by_name["zero_gpu_aot"]["metrics"]["reason"]  # AOTInductor's compile here is for GPU builds


def test_the_smoke_run_lacks_what_the_gpu_machine_lacks():
    """The smoke run hides the packages the machine lacks, so a step that imports one fails here
    too (a copy of .venv without them showed that the documents and dataset steps import
    nh3, apted and three more, which the machine lacks; they are carried since)."""
    assert machine.lacks() == ["captum", "gradio", "mcp", "torchao"]
    probe = ("import importlib.util, sys; assert importlib.util.find_spec('gradio') is None; "
             "import transformers; from transformers.utils import is_torchao_available; "
             "assert not is_torchao_available(); print('ok')")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env=machine.environment())
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_smoke_model_has_the_real_geometry(report):
    real = read_raw_config(REAL_CONFIG_DIR)
    load = steps(report)["load"]["metrics"]
    assert load["vision_layers"] == real["vision_config"]["num_hidden_layers"]
    assert load["text_layers"] == real["text_config"]["num_hidden_layers"]
    assert load["deepstack_layer_map"] == real["deepstack_layer_map"]
    assert load["spatial_target_layers"] == real["spatial_target_layers"]
    assert load["pinpoints"] == len(real["image_grid_pinpoints"]) == 27
    assert load["vocab_size"] == real["text_config"]["vocab_size"]


def test_chat_sees_the_real_image_token_count_and_measures_every_path(report):
    """The chat step: 1320 image tokens (planned here from the real config); decode rates of bare
    generate, the reference path and the decode loop (the compiled loop joins on a GPU); its
    chats answered at once equal their answers alone (float32 on the CPU)."""
    from g4v.loading import load_config
    from g4v.tiling import plan_tiling
    from gpu_check import SMOKE_SIZES

    chat = steps(report)["chat"]["metrics"]
    assert chat["image_tokens"] == 1320 == plan_tiling((768, 1536), load_config(REAL_CONFIG_DIR)).num_image_tokens
    assert chat["ttft_s"] > 0 and chat["bandwidth_bound_tok_s"] > 0
    assert set(chat["decode_tok_s"]) == {"bare generate", "engine (reference path)", "engine (decode loop)"}
    rate = chat["decode_tok_s_batch1"]
    assert timed(rate) and str(rate) == str(chat["decode_tok_s"]["engine (decode loop)"])  # NaN equals NaN here
    assert chat["chats"] == SMOKE_SIZES.batch == chat["same_as_alone"] and chat["chats_over_one_at_a_time"] > 0


def test_tiling_covers_all_27_pinpoints(report):
    from g4v.loading import load_config
    from g4v.tiling import plan_tiling

    config = load_config(REAL_CONFIG_DIR)
    rows = steps(report)["tiling_27_pinpoints"]["metrics"]["pinpoints"]
    assert [[h, w] for h, w, _, _ in rows] == config.image_grid_pinpoints
    assert [tokens for _, _, tokens, _ in rows] == [plan_tiling((h, w), config).num_image_tokens for h, w, _, _ in rows]


def test_merged_lora_equals_attached_adapter(report):
    lora = steps(report)["lora"]["metrics"]
    assert lora["adapter_vs_base_max_rel"] > 1e-4, "the random adapter must change the logits"
    assert lora["merged_vs_adapter_max_rel"] < 1e-4
    assert lora["merged_layers"] == 7 * 40  # q, k, v, o, gate, up, down in each of the 40 layers


def test_a_failing_step_is_recorded_and_the_next_still_runs():
    """Step isolation, without a model: a raising step is 'failed' with its one-line error; steps
    that need the model are then 'skipped' with the reason; a step past the budget is skipped."""
    import time
    from pathlib import Path

    import torch
    from gpu_check import SMOKE_SIZES, Check, run_step

    check = Check(torch.device("cpu"), torch.float32, SMOKE_SIZES, Path("."), True)

    def broken(check):
        raise MemoryError("out of memory\nsecond line")

    failed = run_step(check, "load", broken, time.monotonic() + 60)
    assert failed.status == "failed" and failed.error == "MemoryError: out of memory"
    assert "traceback" in failed.metrics
    later = run_step(check, "chat", lambda check: {"x": 1}, time.monotonic() + 60)
    assert later.status == "skipped" and "did not load" in later.error
    late = run_step(check, "load", lambda check: {}, time.monotonic() - 1)
    assert late.status == "skipped" and "out of time" in late.error


def test_a_pdf_page_is_asked_with_both_document_presets_and_read(report):
    """The report's chart page, rendered as the Chat tab renders it, gets the real model's tiling
    plan's image tokens (planned here from the real config), and both answers come back read: with
    random weights as a parse error in one line, not as an exception."""
    from g4v.documents.examples import REPORT_PDF
    from g4v.documents.pdf import render_pages
    from g4v.loading import load_config
    from g4v.tiling import plan_tiling

    page = render_pages(REPORT_PDF, [1])[0]
    documents = steps(report)["documents"]["metrics"]
    assert documents["page_px"] == [page.width, page.height]
    assert documents["image_tokens"] == plan_tiling((page.height, page.width), load_config(REAL_CONFIG_DIR)).num_image_tokens
    for key in ("chart2csv", "kvp"):
        read = documents[key]
        assert read["read_ok"] or (isinstance(read["read_error"], str) and "\n" not in read["read_error"]), read
        assert read["prompt_tokens"] > documents["image_tokens"]


def test_the_dataset_run_compares_both_arms_on_every_row(report):
    """Both arms run the same weights greedily: every row agrees and the teacher-forced KL is 0."""
    from gpu_check_steps import DATASET_ROWS

    run = steps(report)["dataset_run"]["metrics"]
    assert run["rows"] == DATASET_ROWS["smoke"] and run["complete"] and run["agreement"] == 1.0
    assert run["kl"]["max"] < 1e-6


def test_the_batching_step_answers_every_row_both_ways(report):
    """One hf arm one by one and batched on the same rows (issue 36's batched-arm ratio at real
    geometry); float32 on the CPU, so every answer is the same greedy tokens both ways."""
    from gpu_check_steps import BATCHING_ROWS

    batching = steps(report)["dataset_batching"]["metrics"]
    assert batching["rows"] == BATCHING_ROWS["smoke"] and batching["same_answers"] == batching["rows"]
    assert batching["one_by_one_s"] > batching["encoding_s_one_by_one"] > 0
    assert batching["batched_s"] > batching["encoding_s_batched"] > 0


def test_the_vision_lora_runs_native_and_merged_at_real_geometry(report):
    """A random rank-256 LoRA (alpha 256) on all 7 projections of the 40 layers, applied as the
    engines apply it: it changes the logits, and merged equals native within float32 rounding (the
    smoke run's dtype; bf16 on the GPU, where this is the number docs/benchmarks.md's row reports)."""
    lora = steps(report)["vision_lora"]["metrics"]
    assert (lora["rank"], lora["alpha"], lora["modules"]) == (256, 256.0, 7 * 40)
    assert lora["native_vs_base_max_rel"] > 1e-3, "the random vision LoRA must change the logits"
    assert lora["merged_vs_native_max_rel"] < 1e-4
    for mode in ("native", "merged"):
        numbers = lora[mode]
        assert numbers["apply_s"] > 0 and numbers["ttft_s"] > 0 and numbers["peak_bytes"] > 0
        assert timed(numbers["decode_tok_s_batch1"]) and numbers["bare_generate_tok_s"] > 0  # generate: every token timed
    assert lora["native"]["vision_copy"].startswith("merged copy") and timed(lora["native"]["peft_layers_tok_s"])
    assert timed(lora["bandwidth_ratio"]) and "vision_lora" in report["table"]


def test_the_circuits_views_run_at_real_geometry(report):
    """Attention, knockout and patching on the real image-token count (planned here from the real
    config) and all 40 layers; patching every level from B gives B's own first-token distribution."""
    from g4v.circuits.knockout import knockout_layers
    from g4v.circuits.common import CircuitSettings
    from g4v.loading import load_config
    from g4v.tiling import plan_tiling
    from gpu_check import SMOKE_SIZES

    config = load_config(REAL_CONFIG_DIR)
    circuits = steps(report)["circuits"]["metrics"]
    assert circuits["image_tokens"] == plan_tiling(SMOKE_SIZES.image_hw, config).num_image_tokens == 1320
    assert circuits["layers"] == config.text_config.num_hidden_layers == 40
    assert circuits["knockout_layers"] == len(knockout_layers(config, CircuitSettings(window=1)))
    assert circuits["patching_runs"] == 4  # A, B, A with B's deepstack0, A with all of B's levels
    assert 0 < circuits["image_share_max"] <= 1 + 1e-5
    assert circuits["bound_vs_donor_max_abs"] < 1e-4
    assert min(circuits[f"{view}_s"] for view in ("attention", "knockout", "patching")) > 0
    assert "circuits" in report["table"]
