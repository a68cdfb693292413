"""Attribution on the bundled checkpoint, checked against independent computations: autograd on the
model's own features (gradient x input), the completeness of integrated gradients and the deletion
curve against the model's own outputs, the logit lens against the model's own logits; and nothing
left behind on the shared engine."""

import pytest
import torch

from g4v.attribution.deletion import deletion_curve
from g4v.attribution.forward import answer_ids, encode_image, make_answer
from g4v.attribution.gradients import gradient_x_input, integrated_gradients
from g4v.attribution.lens import logit_lens
from g4v.conversation import Message, SamplingSettings
from g4v.errors import G4VError
from g4v.model.capture import capture_forward
from g4v.model.levels import describe_levels
from g4v.model.sites import site
from tests.conftest import make_image

PROMPT = "What is in the picture?"
ANSWER = " a red square"


@pytest.fixture(scope="module")
def request_inputs(hf_engine):
    image = make_image(200, 150, seed=3)
    return image, hf_engine.prepare_inputs([Message("user", PROMPT, [image])], 8)


@pytest.fixture(scope="module")
def explained(hf_engine, request_inputs):
    """The encoded image, the answer " a red square" (first token explained) and its attribution."""
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    _, inputs = request_inputs
    levels = describe_levels(model.config)
    answer = make_answer(tokenizer, inputs["input_ids"], answer_ids(tokenizer, ANSWER), 0)
    encoded = encode_image(model, inputs)
    return levels, answer, encoded, gradient_x_input(model, encoded, answer, levels)


def _model_own_target(model, inputs, answer, target, edit=None):
    """The target log-probability and its gradient x input per LLM layer, straight from autograd on
    the features the model computes itself from the pixels (its own forward; a pre-hook on its
    language model makes them leaves, after ``edit(layer, features)`` when given)."""
    leaves = {}

    def make_leaves(module, args, kwargs):
        for layer, t in kwargs["deepstack_features"].items():
            leaves[layer] = t.detach().clone().requires_grad_(True)
        features = {layer: edit(layer, leaf) if edit else leaf for layer, leaf in leaves.items()}
        return args, {**kwargs, "deepstack_features": features}

    ids = torch.cat([inputs["input_ids"], torch.tensor([answer])], dim=1)
    handle = site(model, "language_model").register_forward_pre_hook(make_leaves, with_kwargs=True)
    try:
        with torch.enable_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                           image_sizes=inputs["image_sizes"]).logits[0]
            prompt_len = inputs["input_ids"].shape[1]
            logprobs = torch.log_softmax(logits, dim=-1)
            per_token = torch.stack([logprobs[prompt_len - 1 + i, tok] for i, tok in enumerate(answer)])
            value = per_token.sum() if target is None else per_token[target]
            layers = sorted(leaves)
            grads = torch.autograd.grad(value, [leaves[layer] for layer in layers])
    finally:
        handle.remove()
    return float(value.detach()), {layer: (g * leaves[layer]).sum(-1).detach() for layer, g in zip(layers, grads)}


@pytest.mark.parametrize("target", [0, None])
def test_gradient_x_input_equals_autograd_on_the_models_own_features(hf_engine, request_inputs, target):
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    _, inputs = request_inputs
    levels = describe_levels(model.config)
    ids = answer_ids(tokenizer, ANSWER)
    answer = make_answer(tokenizer, inputs["input_ids"], ids, target)
    result = gradient_x_input(model, encode_image(model, inputs), answer, levels)
    expected_value, expected = _model_own_target(model, inputs, ids, target)
    assert result.target_logprob == pytest.approx(expected_value, abs=1e-5)
    assert result.scores.shape == (8, int(inputs["input_ids"].eq(model.config.image_token_id).sum()))
    for i, level in enumerate(levels):
        torch.testing.assert_close(result.scores[i], expected[level.llm_layer], rtol=1e-4, atol=1e-6)
    assert result.scores.abs().sum() > 0


def test_contrast_equals_autograd_on_the_models_own_features(hf_engine, request_inputs):
    """Log-odds of the answer against two rivals: the value and gradient x input equal autograd on
    the model's own features, one plain forward per answer (no padding, no batching)."""
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    _, inputs = request_inputs
    levels = describe_levels(model.config)
    rivals = (" a blue circle", " green")
    answer = make_answer(tokenizer, inputs["input_ids"], answer_ids(tokenizer, ANSWER), 0, rivals)
    assert answer.target is None and "against" in answer.describe()
    result = gradient_x_input(model, encode_image(model, inputs), answer, levels)
    runs = [_model_own_target(model, inputs, answer_ids(tokenizer, text), None) for text in (ANSWER, *rivals)]
    values = torch.tensor([value for value, _ in runs])
    weights = torch.softmax(values[1:], 0)  # d logsumexp / d rival
    assert result.target_logprob == pytest.approx(float(values[0] - torch.logsumexp(values[1:], 0)), abs=1e-5)
    for i, level in enumerate(levels):
        expected = runs[0][1][level.llm_layer] - sum(w * run[1][level.llm_layer] for w, run in zip(weights, runs[1:]))
        torch.testing.assert_close(result.scores[i], expected, rtol=1e-4, atol=1e-6)
    with pytest.raises(G4VError, match="the answer itself"):
        make_answer(tokenizer, inputs["input_ids"], answer_ids(tokenizer, ANSWER), None, (ANSWER,))
    repeated = make_answer(tokenizer, inputs["input_ids"], answer_ids(tokenizer, ANSWER), 0, (" green", *rivals, " green"))
    assert repeated.alternative_texts == [" green", " a blue circle"]  # each rival counted once in the log-odds


def test_integrated_gradients_complete_against_the_models_own_outputs(hf_engine, request_inputs, explained):
    """Sum of IG scores ~ f(features) - f(no features), both ends from the inspector's own runs (the
    plain forward, and the forward with every level scaled by 0 by its hooks)."""
    model = hf_engine.model
    _, inputs = request_inputs
    levels, answer, encoded, _ = explained
    result = integrated_gradients(model, encoded, answer, levels, steps=16)
    with_answer = {**inputs, "input_ids": torch.cat([inputs["input_ids"], torch.tensor([answer.ids])], dim=1)}
    with_answer["attention_mask"] = torch.ones_like(with_answer["input_ids"])
    ends = []
    for scales in ({}, {level.name: 0.0 for level in levels}):
        _, logits = capture_forward(model, with_answer, scales=scales, levels=levels,
                                    logits_to_keep=len(answer.ids) + 1)
        ends.append(float(torch.log_softmax(logits[0, 0], -1)[answer.ids[0]]))
    change = ends[0] - ends[1]
    assert result.target_logprob == pytest.approx(ends[0], abs=1e-5)
    assert result.baseline_logprob == pytest.approx(ends[1], abs=1e-5)
    assert abs(change) > 1e-3  # the image matters to this target, so completeness says something
    assert float(result.scores.sum()) == pytest.approx(change, abs=0.02 * abs(change) + 1e-4)


def test_deletion_curve_matches_the_model_with_those_tokens_zeroed(hf_engine, request_inputs, explained):
    """The attributed curve's points are the model's own log-probabilities with the top tokens'
    features zeroed (at one level here, by a hook on the model's own forward)."""
    model = hf_engine.model
    _, inputs = request_inputs
    levels, answer, encoded, attribution = explained
    curve = deletion_curve(model, encoded, answer, attribution, level="deepstack1", fractions=(0, 0.25), seeds=2,
                           ranking="signed")
    assert curve.attributed[0] == pytest.approx(attribution.target_logprob, abs=1e-5)
    assert [run[0] for run in curve.random] == pytest.approx([attribution.target_logprob] * 2, abs=1e-5)
    tokens = attribution.scores.shape[1]
    top = torch.argsort(attribution.scores[1], descending=True)[: round(0.25 * tokens)]
    layer = levels[1].llm_layer

    def zero_top(at, features):
        if at != layer:
            return features
        keep = torch.ones(tokens, 1)
        keep[top] = 0.0
        return features * keep

    expected, _ = _model_own_target(model, inputs, answer.ids, 0, edit=zero_top)
    assert curve.attributed[1] == pytest.approx(expected, abs=1e-5)
    assert curve.area_between == pytest.approx(0.25 * (sum(r[1] for r in curve.random) / 2 - curve.attributed[1]) / 2, abs=1e-7)

    # "positive" (the default) removes, at every level, the tokens whose levels bring the most evidence for the target
    positive = deletion_curve(model, encoded, answer, attribution, fractions=(0, 0.25), seeds=1)
    evidence = attribution.scores.clamp(min=0).sum(0)  # (tokens,)
    top = torch.argsort(evidence, descending=True, stable=True)[: round(0.25 * tokens)]

    def zero_top_everywhere(at, features):
        keep = torch.ones(tokens, 1)
        keep[top] = 0.0
        return features * keep

    expected, _ = _model_own_target(model, inputs, answer.ids, 0, edit=zero_top_everywhere)
    assert positive.ranking == "positive" and positive.attributed[1] == pytest.approx(expected, abs=1e-5)


def test_logit_lens_last_layer_is_the_models_own_logits(hf_engine, request_inputs):
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    _, inputs = request_inputs
    levels = describe_levels(model.config)
    lens = logit_lens(model, inputs, tokenizer, levels)
    with torch.inference_mode():
        logits = model(**inputs).logits[0]  # (seq, vocab), with Granite's logits scaling
    image = inputs["input_ids"][0] == model.config.image_token_id
    probs = torch.softmax(logits[image].float(), dim=-1)
    assert len(lens.layers) == model.config.text_config.num_hidden_layers + 1
    assert lens.layers[-1].top_ids == probs.argmax(-1).tolist()
    assert lens.layers[-1].top_probs == pytest.approx(probs.max(-1).values.tolist(), abs=1e-5)
    assert [v.name for v in lens.levels] == [level.name for level in levels]
    assert all(len(v.top_ids) == int(image.sum()) for v in lens.layers + lens.levels)


def _module_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in model.modules())


@pytest.mark.slow  # about 8 s on a quiet 2-core machine
def test_a_full_request_leaves_no_hooks_and_the_next_chat_unchanged(hf_engine, request_inputs, tmp_path):
    from g4v.attribution.run import AttributionSettings, run_attribution

    image, _ = request_inputs
    model = hf_engine.model
    chat = [Message("user", "Describe it.", [image])]
    settings = SamplingSettings(max_new_tokens=8)
    before = hf_engine.generate(chat, settings).token_ids
    hooks, grads = _module_hooks(model), [p.requires_grad for p in model.parameters()]
    report = run_attribution(hf_engine, image, PROMPT, AttributionSettings(method="ig", steps=4, seeds=1,
                                                                           fractions=(0, 0.5)), out_dir=tmp_path)
    assert _module_hooks(model) == hooks
    assert [p.requires_grad for p in model.parameters()] == grads
    assert hf_engine.generate(chat, settings).token_ids == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in report.files)
    assert report.answer.target == 0 and report.lens is not None
    assert report.to_dict()["answer"]["target"] == 0 and report.to_dict()["lens"] is not None


def test_bad_requests_get_one_line(hf_engine, request_inputs, tmp_path):
    from g4v.attribution.run import AttributionSettings, run_attribution

    image, _ = request_inputs
    cases = [
        (AttributionSettings(target=" red", token=5), "answer token 5 does not exist"),
        (AttributionSettings(target="   "), "target answer is empty"),
        (AttributionSettings(method="saliency"), "unknown attribution method"),
        (AttributionSettings(deletion_level="deepstack9"), "unknown level"),
        (AttributionSettings(fractions=(0.5,)), "deletion fractions"),
        (AttributionSettings(method="ig", steps=1), "steps must be a whole number from 2 to 512"),
        (AttributionSettings(seeds=0), "seeds must be a whole number from 1 to 50"),
    ]
    for settings, words in cases:
        with pytest.raises(G4VError, match=words) as info:
            run_attribution(hf_engine, image, PROMPT, settings, out_dir=tmp_path)
        assert "\n" not in str(info.value)
    with pytest.raises(G4VError, match="prompt is empty"):
        run_attribution(hf_engine, image, "  ", out_dir=tmp_path)
