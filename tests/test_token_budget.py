"""Token budgets on the trained demo checkpoint: a kept-K% answer against a forward pass built here,
independently, on the sequence without the dropped tokens; ``keep=100`` is the plain request; the
policies rank by what they say (checked against the Deepstack capture, the Circuits attention view
and a seeded draw).

The reference below never calls :mod:`g4v.model.token_budget`'s reduction: it takes the kept token
indices only, encodes the picture with the vision tower itself, removes positions from
``input_ids`` and rows from each level's features with its own code, and runs the language model
with transformers' own injection arguments (``vision_mask``, ``deepstack_features``), greedily and
without a KV cache.
"""

import pytest
import torch
from PIL import Image

from g4v.conversation import Message, SamplingSettings
from g4v.engines.base import GenerationRequest
from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET
from g4v.model.token_budget import POLICIES, TokenBudget, reduce_request
from g4v.paths import TRAINED_MODEL_DIR

GREEDY = SamplingSettings(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def engine():
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


def picture(n: int) -> Image.Image:
    return Image.open(BUNDLED_DATASET / f"images/p{n:03d}.png").convert("RGB")


@pytest.fixture(scope="module")
def request_(engine):
    return engine.prepare([Message("user", "What colour is the star?", [picture(0)])])


def reference_greedy(engine, request, kept: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens (and the first step's logits) of the prompt without the image tokens not in
    ``kept``, computed here: own position dropping, own feature rows, no KV cache."""
    model, inputs = engine.model, request.inputs
    ids = inputs["input_ids"][0]
    image_positions = torch.nonzero(ids == model.config.image_token_id).flatten()
    keep_row = torch.zeros(len(image_positions), dtype=torch.bool)
    keep_row[kept] = True
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[image_positions[~keep_row]] = False
    sequence = ids[keep].tolist()
    with torch.no_grad():
        vision = model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"], return_dict=True)
        features = {layer: torch.cat(list(packed))[keep_row] for layer, packed in vision.deepstack_features}
        text_model = model.model.language_model
        tokens, first_logits = [], None
        for _ in range(steps):
            current = torch.tensor([sequence + tokens])
            mask = (current == model.config.image_token_id).unsqueeze(-1)
            embeds = text_model.embed_tokens(current).masked_fill(mask, 0.0)
            hidden = text_model(inputs_embeds=embeds, vision_mask=mask, deepstack_features=features,
                                use_cache=False).last_hidden_state
            logits = model.lm_head(hidden[0, -1]) / model.config.text_config.logits_scaling
            first_logits = logits if first_logits is None else first_logits
            token = int(logits.argmax())
            if token == engine.tokenizer.eos_token_id:
                break
            tokens.append(token)
    return tokens, first_logits


def test_keep_100_is_the_plain_request_itself(engine, request_):
    assert reduce_request(engine, request_, TokenBudget(100, "attention")) is request_
    assert reduce_request(engine, request_, None) is request_


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("keep", [50, 10])
def test_kept_answer_equals_a_forward_without_the_dropped_tokens(engine, request_, policy, keep):
    reduced = reduce_request(engine, request_, TokenBudget(keep, policy))
    kept = reduced.reduction.kept[0]
    total = reduced.reduction.image_tokens[0]
    assert len(kept) == -(-total * keep // 100) and len(set(kept)) == len(kept)
    assert reduced.prompt_tokens == request_.prompt_tokens - (total - len(kept))  # the sequence really shrinks
    answer = engine.generate(reduced, GREEDY)
    tokens, first_logits = reference_greedy(engine, request_, kept, GREEDY.max_new_tokens)
    assert answer.token_ids == tokens
    with engine.adapter_scope(None) as model, torch.inference_mode():
        logits = model(**reduced.inputs, logits_to_keep=1).logits[0, -1]
    torch.testing.assert_close(logits, first_logits, atol=1e-5, rtol=1e-5)


def test_reduced_requests_batch_as_they_answer_alone(engine):
    budget = TokenBudget(25, "norm")
    requests = [reduce_request(engine, engine.prepare([Message("user", prompt, [picture(n)])]), budget)
                for n, prompt in ((1, "What shape is red?"), (2, "How many shapes are there?"), (3, "Where is the star?"))]
    alone = [engine.generate(request, GREEDY).token_ids for request in requests]
    assert [answer.token_ids for answer in engine.generate_batch([GenerationRequest(request, GREEDY) for request in requests], in_flight=3)] == alone


def test_norm_policy_keeps_the_largest_injected_norms(engine, request_):
    """Against the Deepstack capture's per-token injected norms, summed over the 8 levels."""
    from g4v.model.capture import capture_forward

    with engine.adapter_scope(None) as model:
        capture, _ = capture_forward(model, request_.inputs, logits_to_keep=1)
    assert len(capture.levels) == 8
    total = sum(level.injected_norm for level in capture.levels)
    kept = reduce_request(engine, request_, TokenBudget(25, "norm")).reduction.kept[0]
    expected = sorted(torch.argsort(total, descending=True, stable=True)[:len(kept)].tolist())
    assert kept == expected


def test_attention_policy_keeps_what_the_circuits_view_weights_most(engine, request_):
    """Against the Circuits attention view at layer 2, from the last prompt token."""
    from g4v.circuits.attention import image_attention
    from g4v.circuits.common import CircuitSettings

    view = image_attention(engine, picture(0), "What colour is the star?", CircuitSettings(layers="2"))
    weights = view.mean[0]
    kept = reduce_request(engine, request_, TokenBudget(25, "attention")).reduction.kept[0]
    expected = sorted(torch.argsort(weights, descending=True, stable=True)[:len(kept)].tolist())
    assert kept == expected


def test_attribution_policy_keeps_tokens_whose_evidence_is_largest(engine, request_):
    """Against the Attribution panel's gradient x input of the same greedy first token."""
    from g4v.attribution.forward import encode_image, make_answer
    from g4v.attribution.gradients import gradient_x_input
    from g4v.model.levels import describe_levels

    with engine.adapter_scope(None) as model:
        first = int(model(**request_.inputs, logits_to_keep=1).logits[0, -1].argmax())
        encoded = encode_image(model, request_.inputs)
        answer = make_answer(engine.tokenizer, request_.inputs["input_ids"], [first], 0)
        scores = gradient_x_input(model, encoded, answer, describe_levels(model.config)).scores.sum(0)
    kept = reduce_request(engine, request_, TokenBudget(10, "attribution")).reduction.kept[0]
    expected = sorted(torch.argsort(scores, descending=True, stable=True)[:len(kept)].tolist())
    assert kept == expected


def test_random_policy_is_seeded(engine, request_):
    draw = reduce_request(engine, request_, TokenBudget(25, "random")).reduction.kept[0]
    assert reduce_request(engine, request_, TokenBudget(25, "random")).reduction.kept[0] == draw
    assert reduce_request(engine, request_, TokenBudget(25, "random", seed=1)).reduction.kept[0] != draw
    other = engine.prepare([Message("user", "What shape is purple?", [picture(0)])])
    assert reduce_request(engine, other, TokenBudget(25, "random")).reduction.kept[0] != draw


@pytest.mark.parametrize("keep", [0, 101, 50.5, True, "50"])
def test_bad_budgets_are_one_line(keep):
    with pytest.raises(G4VError, match="keep must be a whole percentage from 1 to 100"):
        TokenBudget(keep)
    with pytest.raises(G4VError, match="token policy must be one of norm, attention, attribution, random"):
        TokenBudget(50, "fastv")


def test_bench_measures_each_kept_fraction_on_the_shortened_sequence(tmp_path):
    """The benchmark's sequences are the prompt less the dropped tokens (timings are printed, not asserted)."""
    import json

    from tests.cli import run_cli

    out = tmp_path / "bench.json"
    result = run_cli("bench", "token-budget", "--repeats", "1", "--keeps", "50,10", "--image-size", "128x128",
                     "--device", "cpu", "--json", str(out))
    assert result.returncode == 0, result.stderr
    row = json.loads(out.read_text())[0]
    images, text = row["image_tokens"], row["seq_len"] - row["image_tokens"]
    assert row["seq_lens"] == {f"prefill {k}%": text + -(-images * k // 100) for k in (100, 50, 10)}
    assert set(row["ratios"]) >= {"prefill speed-up 50%", "rank attention / prefill 100%"}
    assert "speed-up" in result.stdout
    bad = run_cli("bench", "token-budget", "--keeps", "50,half")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--keeps" in bad.stderr


def test_a_reduced_request_streams_with_the_vision_lora_as_it_generates():
    """On the layout checkpoint (vision LoRA beside the base, native mode), a reduced request holds
    encoded features, not pixel values: streamed, it still runs with the vision LoRA, giving the
    tokens generate gives, and not the base language model's."""
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import VLORA_MODEL_DIR

    native = TransformersEngine(str(VLORA_MODEL_DIR), device="cpu", dtype="float32", vision_lora="native")
    off = TransformersEngine(str(VLORA_MODEL_DIR), device="cpu", dtype="float32", vision_lora="off")
    settings = SamplingSettings(max_new_tokens=6)
    message = [Message("user", "What colour is the star?", [picture(0)])]
    reduced = reduce_request(native, native.prepare(message, settings.max_new_tokens), TokenBudget(50, "norm"))
    assert "pixel_values" not in reduced.inputs and "mm_encoder_outputs" in reduced.inputs
    generated = native.generate(reduced, settings).text
    assert "".join(native.stream(reduced, settings)) == generated
    without = reduce_request(off, off.prepare(message, settings.max_new_tokens), TokenBudget(50, "norm"))
    assert off.generate(without, settings).text != generated  # the check can tell the LoRA was on
