"""The transformers engine's decode loop (:mod:`g4v.engines.decode_loop`) against the reference path
(transformers' own ``generate``, one request at a time, ``--no-decode-loop``) on the same loaded
model: the same greedy tokens and text, alone and with other chats decoding beside it, for pictures
and text, the native vision LoRA and a user's adapter; seeded sampling; stop, a reader that leaves
and a slow reader; an inspector between two steps; the slots' bookkeeping."""

import threading
import time

import pytest
import torch

from g4v.conversation import Message, SamplingSettings
from g4v.engines.base import fold
from g4v.engines.decode_settings import DecodeSettings
from g4v.engines.hf import TransformersEngine
from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR, TRAINED_MODEL_DIR, VLORA_MODEL_DIR
from tests.conftest import make_image

GREEDY = SamplingSettings(max_new_tokens=24)
REFERENCE = DecodeSettings(decode_loop=False)
#: Pictures of different sizes and tilings, prompts of different lengths, and text alone.
PROMPTS = [
    [Message("user", "What colour is the shape?", [make_image(128, 128, seed=1)])],
    [Message("user", "Describe this wide picture in a few words, please.", [make_image(500, 130, seed=2)])],
    [Message("user", "Tell me a story about a small red square.")],
    [Message("user", "Where is it?", [make_image(300, 260, seed=4)])],
    [Message("user", "Hi.")],
]


def pair(model: str, **options) -> tuple[TransformersEngine, TransformersEngine]:
    """(the loop, the reference path) over one loaded model."""
    loop = TransformersEngine(model, device="cpu", dtype="float32", **options)
    return loop, TransformersEngine(model, loaded=loop.loaded, decode=REFERENCE)


@pytest.fixture(scope="module")
def random_pair():
    loop, reference = pair(str(BUNDLED_MODEL_DIR))
    yield loop, reference
    loop.close()


def together(engine, prompts, settings=GREEDY, adapters=None) -> list:
    """Every prompt submitted at once, one thread each: each one's Generation."""
    answers = [None] * len(prompts)
    adapters = adapters or [None] * len(prompts)

    def ask(index):
        answers[index] = engine.generate(prompts[index], settings, adapter=adapters[index])

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answers


def test_alone_and_together_the_loop_answers_what_generate_answers(random_pair):
    loop, reference = random_pair
    expected = [reference.generate(prompt, GREEDY) for prompt in PROMPTS]
    assert len({tuple(answer.token_ids) for answer in expected}) > 1 or True  # random weights may agree
    alone = [loop.generate(prompt, GREEDY) for prompt in PROMPTS]
    streamed = ["".join(loop.stream(prompt, GREEDY)) for prompt in PROMPTS]
    steps_before = loop._loop.stats.steps, loop._loop.stats.rows_stepped
    batched = together(loop, PROMPTS)
    steps = loop._loop.stats.steps - steps_before[0]
    rows = loop._loop.stats.rows_stepped - steps_before[1]
    for made in (alone, batched):
        assert [(a.token_ids, a.text, a.finish_reason, a.prompt_tokens) for a in made] == \
            [(e.token_ids, e.text, e.finish_reason, e.prompt_tokens) for e in expected]
    assert streamed == [e.text for e in expected]
    assert rows > steps  # the chats did decode together: some steps carried several rows


def test_a_shortest_answer_and_seeded_sampling_equal_the_reference_path(random_pair):
    loop, reference = random_pair
    forced = SamplingSettings(max_new_tokens=20, min_new_tokens=20)
    assert loop.generate(PROMPTS[0], forced).token_ids == reference.generate(PROMPTS[0], forced).token_ids
    sampled = SamplingSettings(max_new_tokens=16, temperature=0.9, top_p=0.8, seed=7)
    ours = [loop.generate(prompt, sampled).token_ids for prompt in PROMPTS[:3]]
    assert ours == [reference.generate(prompt, sampled).token_ids for prompt in PROMPTS[:3]]
    assert [a.token_ids for a in together(loop, PROMPTS[:3], sampled)] == ours  # the others do not move a seed
    other = SamplingSettings(max_new_tokens=16, temperature=0.9, top_p=0.8, seed=8)
    assert loop.generate(PROMPTS[0], other).token_ids != ours[0]


@pytest.mark.slow
@pytest.mark.parametrize("copy", ["on", "off"])
def test_the_native_vision_lora_per_request_merged_copy_or_peft(copy):
    """Image requests with the vision LoRA (on a merged copy, or through PEFT's layers), text-only
    ones on the base language model, alone and mixed in one batch."""
    from tests.vision_lora_cases import IMAGE_PROMPTS, TEXT_PROMPTS

    loop, reference = pair(str(VLORA_MODEL_DIR), vision_lora="native", decode=DecodeSettings(vision_copy=copy))
    prompts = IMAGE_PROMPTS[:4] + TEXT_PROMPTS
    settings = SamplingSettings(max_new_tokens=8)
    expected = [reference.generate(prompt, settings).token_ids for prompt in prompts]
    assert [loop.generate(prompt, settings).token_ids for prompt in prompts] == expected
    assert [answer.token_ids for answer in together(loop, prompts, settings)] == expected
    assert loop.variant(None, image=True).merged == ("g4v_vision_lora" if copy == "on" else None)
    loop.close()


@pytest.mark.slow
def test_a_users_adapter_per_request_beside_the_base():
    loop, reference = pair(str(TRAINED_MODEL_DIR))
    for engine in (loop, reference):
        engine.register_adapter("french", str(ASSETS_DIR / "adapters" / "tiny-trained-french"))
    settings = SamplingSettings(max_new_tokens=8)
    prompts = PROMPTS[:4]
    adapters = ["french", None, "french", None]
    expected = [reference.generate(p, settings, adapter=a).token_ids for p, a in zip(prompts, adapters)]
    assert expected[0] != reference.generate(prompts[0], settings).token_ids  # the adapter changes the answer
    assert [a.token_ids for a in together(loop, prompts, settings, adapters)] == expected
    loop.close()


def _pending_drops_to_zero(loop, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while loop._loop.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    return loop._loop.pending() == 0


def test_stop_and_a_reader_that_leaves_free_the_slot(random_pair):
    loop, _ = random_pair
    long = SamplingSettings(max_new_tokens=400)
    cancel = threading.Event()
    pieces = loop.stream_outputs(PROMPTS[0], long, cancel=cancel)
    next(pieces)
    cancel.set()
    last = list(pieces)[-1]
    assert last.finish_reason == "cancelled" and _pending_drops_to_zero(loop)
    left = loop.stream(PROMPTS[1], long)
    next(left)
    left.close()  # the reader goes away
    assert _pending_drops_to_zero(loop)
    assert loop.generate(PROMPTS[2], GREEDY).finish_reason in ("stop", "length")  # the engine serves on


def test_a_slow_reader_stalls_no_one(random_pair):
    loop, reference = random_pair
    slow = loop.stream_outputs(PROMPTS[0], SamplingSettings(max_new_tokens=200))
    next(slow)  # then it reads nothing while another chat is answered
    began = time.monotonic()
    fast = loop.generate(PROMPTS[3], GREEDY)
    assert fast.token_ids == reference.generate(PROMPTS[3], GREEDY).token_ids
    assert time.monotonic() - began < 60
    rest = list(slow)
    assert rest[-1].finish_reason in ("stop", "length")


def test_an_inspector_gets_the_model_between_two_steps(random_pair):
    """While a long answer decodes, ``adapter_scope`` (what every inspector holds) is granted after
    a step, not after the answer: the answer is still going when the inspector has run."""
    loop, _ = random_pair
    pieces = loop.stream_outputs(PROMPTS[0], SamplingSettings(max_new_tokens=600, min_new_tokens=600))
    next(pieces)
    with loop.adapter_scope(None) as model, torch.inference_mode():
        model(**loop.prepare_inputs(PROMPTS[4]), logits_to_keep=1)
    assert loop._loop.pending() == 1  # still answering
    assert len([piece for piece in pieces if piece.token_ids]) >= 1


def test_a_request_that_fails_in_its_prefill_fails_alone(random_pair):
    """A prepared request whose pixel values do not match its image tokens makes the model raise in
    the prefill: that request gets the error, a chat beside it is answered."""
    from dataclasses import replace

    loop, reference = random_pair
    request = loop.prepare(PROMPTS[0])
    broken = replace(request, inputs={**request.inputs, "pixel_values": request.inputs["pixel_values"][:, :1]})
    with pytest.raises(Exception):
        loop.generate(broken, GREEDY)
    assert loop.generate(PROMPTS[3], GREEDY).token_ids == reference.generate(PROMPTS[3], GREEDY).token_ids


def test_a_row_whose_draw_fails_in_a_step_ends_alone(random_pair):
    """A sampled row whose draw fails in a step the others share (its logits divided by a temperature
    so small that they overflow: the settings' check refuses one, so the test gives it to the row
    while it runs) ends with the error; the greedy chats in the same steps get their alone answers."""
    from dataclasses import replace

    loop, reference = random_pair
    long = SamplingSettings(max_new_tokens=200, min_new_tokens=200)
    expected = [reference.generate(prompt, long).token_ids for prompt in PROMPTS[:2]]
    greedy = [loop.stream_outputs(prompt, long) for prompt in PROMPTS[:2]]
    sampled = loop.stream_outputs(PROMPTS[2], SamplingSettings(max_new_tokens=200, min_new_tokens=200,
                                                               temperature=0.9, seed=1))
    assert next(sampled).token_ids  # its first token came; it joins the greedy rows' steps
    deadline = time.monotonic() + 30
    while not (rows := [ask for ask in loop._loop._running if not ask.settings.greedy]) and time.monotonic() < deadline:
        time.sleep(0.001)  # the token is handed over just before the row joins
    [row] = rows
    row.settings = replace(row.settings, temperature=1e-40)
    with pytest.raises(RuntimeError, match="probability tensor"):
        list(sampled)
    assert [fold(pieces).token_ids for pieces in greedy] == expected
    assert _pending_drops_to_zero(loop)


def test_an_answer_past_the_first_capacity_grows_the_slots(random_pair):
    """The slots start at 512 positions for this prompt; 400 tokens more outgrow them mid-answer."""
    loop, reference = random_pair
    settings = SamplingSettings(max_new_tokens=400, min_new_tokens=400)
    assert loop.prepare(PROMPTS[0]).prompt_tokens + 400 > 512
    assert loop.generate(PROMPTS[0], settings).token_ids == reference.generate(PROMPTS[0], settings).token_ids


@pytest.mark.slow
def test_the_compiled_step_answers_what_the_eager_loop_answers():
    """``torch.compile`` of the decode step (on the CPU here, inductor; CUDA graphs on a GPU): the
    same greedy tokens for pictures and text, one at a time and together."""
    # Two rows at most: a batch of one and a padded batch of two (each shape is a graph to compile,
    # which on the CPU takes seconds); two pictures (the merged vision LoRA) and text (the base).
    # All three are queued at once, in this order: the second picture joins the first (same
    # variant, answers of 48 tokens) and they decode as one batch; the text waits for them. (From
    # threads the order was left to chance: a text queued between the pictures kept them apart.)
    loop, reference = pair(str(VLORA_MODEL_DIR), vision_lora="native",
                           decode=DecodeSettings(compile_decode="on", max_batch=2))
    prompts, settings = PROMPTS[:3], SamplingSettings(max_new_tokens=48, min_new_tokens=48)
    expected = [reference.generate(prompt, settings).token_ids for prompt in prompts]
    assert [loop.generate(prompt, settings).token_ids for prompt in prompts] == expected
    queued = [loop.stream_outputs(prompt, settings) for prompt in prompts]
    assert [fold(pieces).token_ids for pieces in queued] == expected
    assert {batch for _, batch, _ in loop._loop.stats.compile_seconds} == {1, 2}  # it compiled both shapes
    loop.close()


@pytest.mark.slow
def test_the_step_compiled_ahead_of_time_answers_what_the_eager_loop_answers(tmp_path):
    """The ZeroGPU path (:mod:`g4v.engines.aot`) through AOTInductor on the CPU: the step exported
    for a batch of one, for an image request's variant (the merged vision LoRA) and a text-only
    one's, compiled, installed, and run by an engine that decodes in each request's thread."""
    from g4v.engines.aot import compile_here, installed, variants

    loop, reference = pair(str(VLORA_MODEL_DIR), vision_lora="native", inline=True)
    for number, variant in enumerate(variants(loop)):
        (tmp_path / str(number)).mkdir()
        compile_here(loop, tmp_path / str(number), variant)
    assert len(installed(loop)) == 2
    settings = SamplingSettings(max_new_tokens=12, min_new_tokens=12)
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[3]]
    assert [loop.generate(p, settings).token_ids for p in prompts] == [reference.generate(p, settings).token_ids
                                                                        for p in prompts]
    assert loop._loop.stats.ahead_steps == 3 * 11  # every decode step ran the compiled program
    loop.close()


def test_the_slots_keep_each_rows_keys_through_drops_and_growth():
    """:class:`~g4v.engines.slots.Slots` against a plain list of per-row tensors."""
    from transformers import DynamicCache

    from g4v.engines.slots import Slots

    torch.manual_seed(0)
    slots = Slots(rows=3, device=torch.device("cpu"), limit=4096)
    kept = []
    for length in (5, 300, 7):
        cache = DynamicCache()
        keys, values = torch.randn(1, 2, length, 4), torch.randn(1, 2, length, 4)
        cache.update(keys, values, 0)
        slots.add(cache, length)
        kept.append((keys[0], values[0]))
    assert slots.capacity == 512  # 300 + 1 tokens outgrew the first 256
    slots.drop(0)  # the last row moves into row 0
    kept = [kept[2], kept[1]]
    slots.reserve(900)
    assert slots.capacity == 1024 and slots.lengths == [7, 300]
    for row, (keys, values) in enumerate(kept):
        length = keys.shape[1]
        assert torch.equal(slots.keys[0][row, :, :length], keys) and torch.equal(slots.values[0][row, :, :length], values)
    cache, positions, mask = slots.step(batch=2, window=301)
    assert positions.tolist() == [7, 300] and mask[0, 0, 0, :9].tolist() == [True] * 8 + [False]


def test_the_text_of_pieces_is_the_answer_decoded_in_one_go():
    """Random token ids, fed in random chunks, through :class:`IncrementalText`: the pieces add up
    to the tokenizer's own decode of all of them (multi-byte characters split across tokens included)."""
    import random

    from transformers import AutoTokenizer

    from g4v.engines.detokenize import DECODE, IncrementalText

    tokenizer = AutoTokenizer.from_pretrained(str(TRAINED_MODEL_DIR))
    accents = tokenizer("Héllo wörld! 日本語 ✓", add_special_tokens=False)["input_ids"]
    for trial in range(200):
        rng = random.Random(trial)
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))] + accents
        text, at = IncrementalText(tokenizer), 0
        out = ""
        while at < len(ids):
            step = rng.choice([1, 1, 2, 3])
            out += text.add(ids[at:at + step])
            at += step
        assert out + text.finish() == tokenizer.decode(ids, **DECODE)
