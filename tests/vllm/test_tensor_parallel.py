"""Tensor parallelism (TP=2) on vLLM's CPU build agrees with transformers, base and adapter.

docs/engines.md tells users to scale out with ``--tensor-parallel-size``; vLLM's port then shards the
SigLIP tower, every window Q-Former, the projectors and the language model across ranks. The
bundled checkpoint cannot be split (its SigLIP and Q-Formers have one head), so this module builds
the same architecture with every head count even (``g4v.demo.build.build(out, shardable=True)``,
random weights) and starts vLLM once with two ranks, each worker on its own core
(``VLLM_CPU_OMP_THREADS_BIND="0|1"``; the CI machine has exactly two) and LoRA slots on.

Checked against transformers (float32, the reference): the per-level features that vLLM's
``embed_multimodal`` computes on transformers' own pixel values (the port inspector's comparison and
tolerance, :mod:`g4v.port.compare`), and the greedy tokens, without and with a random LM LoRA.
The adapter is LM-only, so the features it sees are the base model's; its own check is the tokens.

Pipeline parallelism is not tested here: vLLM's CPU build 0.32 fails it even for a text-only
Granite model (see docs/gpu_check.md); the GPU check is where it is to be tested.
"""

import functools
import os

import pytest
from g4v_cases import GREEDY, make_lm_lora, picture

from g4v.conversation import Message

pytestmark = pytest.mark.vllm

PROMPT = "What colour is the shape?"
ADAPTER = "tp-lora"
#: Pictures on different anyres grids of the tiny checkpoint (1x1 and 1x3 tiles).
PICTURES = {"square": picture(120, 120, seed=3), "wide": picture(380, 120, seed=4)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    from g4v.demo.build import SHARDABLE_WIDTHS, build

    out = tmp_path_factory.mktemp("tp") / "tiny-shardable"
    build(out, shardable=True)
    assert all(SHARDABLE_WIDTHS[key] % 2 == 0 for key in ("vision_heads", "text_heads", "text_kv_heads"))
    assert SHARDABLE_WIDTHS["vision_hidden"] // 64 % 2 == 0, "vLLM's Q-Former heads must split too"
    return str(out)


@pytest.fixture(scope="module")
def references(checkpoint, tmp_path_factory) -> dict:
    """Everything transformers computes, before vLLM starts (its CPU workers keep both cores busy):
    per picture the reference run (inputs and per-level features) and the greedy tokens without
    and with a random LoRA (saved by PEFT, registered on a second engine); and the adapter's folder."""
    from g4v.engines.hf import TransformersEngine
    from g4v.port.run import reference_run

    base = TransformersEngine(checkpoint, device="cpu", dtype="float32")
    folder = tmp_path_factory.mktemp("tp-lora") / ADAPTER
    make_lm_lora(TransformersEngine(checkpoint, device="cpu", dtype="float32"), folder, seed=2)  # wraps that model
    adapted = TransformersEngine(checkpoint, device="cpu", dtype="float32")
    adapted.register_adapter(ADAPTER, str(folder))  # the adapter as the engines take one, per request
    out = {"engine": base, "lora_folder": str(folder)}
    for name, image in PICTURES.items():
        messages = [Message("user", PROMPT, [image])]
        out[name] = {"run": reference_run(base, image, PROMPT, max_new_tokens=0), "messages": messages,
                     "base": base.generate(messages, GREEDY).token_ids,
                     "adapted": adapted.generate(messages, GREEDY, adapter=ADAPTER).token_ids}
    return out


@pytest.fixture(scope="module")
def llm(checkpoint, references):
    """vLLM with two tensor-parallel ranks; the one vLLM start of this module."""
    from vllm import LLM

    from g4v.engines.vllm_settings import VLLMSettings, engine_arguments

    settings = VLLMSettings(tensor_parallel_size=2, max_model_len=2048, max_images=1, max_lora_rank=8, max_loras=2)
    arguments = engine_arguments(checkpoint, settings)
    arguments["enable_prefix_caching"] = False
    saved = {name: os.environ.get(name) for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_ALLOW_INSECURE_SERIALIZATION")}
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core per rank
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # apply_model ships the probe function (g4v.port.probe)
    try:
        engine = LLM(**arguments)
        yield engine
        engine.llm_engine.engine_core.shutdown()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def vllm_greedy(llm, engine, messages, lora_path: str | None = None) -> list[int]:
    """vLLM's greedy tokens for ``messages``, cut at end-of-text like the engines' ``Generation``."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    prompt = {"prompt": engine.render_prompt(messages), "multi_modal_data": {"image": messages[-1].images}}
    lora = LoRARequest(ADAPTER, 1, lora_path) if lora_path else None
    output = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=GREEDY.max_new_tokens),
                          lora_request=lora, use_tqdm=False)[0]
    ids = list(output.outputs[0].token_ids)
    eos = engine.tokenizer.eos_token_id
    return ids[: ids.index(eos)] if eos in ids else ids


def test_vllm_really_runs_two_ranks(llm):
    from g4v.port import worker

    facts = llm.apply_model(worker.module_facts)
    assert len(facts) == 2, "one answer per tensor-parallel worker"
    assert facts[0] == facts[1]


@pytest.mark.parametrize("name", sorted(PICTURES))
def test_per_level_features_match_transformers(llm, references, name):
    from g4v.port import worker
    from g4v.port.compare import compare_levels, default_tolerance, split_levels

    ref = references[name]["run"]
    inputs = ref["inputs"]
    per_rank = llm.apply_model(functools.partial(worker.embed_levels, pixel_values=inputs["pixel_values"].cpu(),
                                                 image_sizes=inputs["image_sizes"].cpu()))
    assert len(per_rank) == 2
    rows = []
    for embedded in per_rank:  # every rank must hold the whole (gathered) features
        levels = split_levels(embedded["packed"][0], embedded["llm_layers"], embedded["hidden"])
        rows = compare_levels(ref["levels"], ref["features"], levels, default_tolerance(inputs["pixel_values"].dtype))
        assert len(rows) == 8
        for row in rows:
            assert row.ok, row.to_dict()
    assert all(row.to_dict()["reference_max_abs"] > 1e-3 for row in rows), "features must not be trivially zero"


@pytest.mark.parametrize("name", sorted(PICTURES))
def test_greedy_tokens_match_transformers(llm, references, name):
    case, engine = references[name], references["engine"]
    assert case["base"] != case["adapted"], "the random adapter must change the answer, or its check proves nothing"
    assert vllm_greedy(llm, engine, case["messages"]) == case["base"]
    assert vllm_greedy(llm, engine, case["messages"], references["lora_folder"]) == case["adapted"]
