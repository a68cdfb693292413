"""The app's engine, described from its folder and loaded once its page is served
(:mod:`g4v.engines.deferred`): the page built from it is the page built from a loaded engine, the
page is built without loading it, its answers are the loaded engine's, and bad models are refused
before anything is served."""

import shutil
import threading

import pytest

from g4v.conversation import Message, SamplingSettings
from g4v.engines import create_engine
from g4v.engines.capabilities import Instrumentable, require
from g4v.engines.deferred import DeferredEngine
from g4v.errors import G4VError
from g4v.paths import BUNDLED_MODEL_DIR, VLORA_MODEL_DIR
from tests.conftest import make_image

CPU = {"device": "cpu", "dtype": "float32"}
#: What loading writes into a config (the dtype weights were loaded in, the folder they came from).
SET_BY_LOADING = {"dtype", "_name_or_path"}


def geometry(config) -> dict:
    """A config as the page reads it: everything but what loading writes in."""
    def strip(value):
        return {k: strip(v) for k, v in value.items() if k not in SET_BY_LOADING} if isinstance(value, dict) else value
    return strip(config.to_dict())


@pytest.mark.parametrize("model, mode", [(BUNDLED_MODEL_DIR, None), (VLORA_MODEL_DIR, "native"),
                                         (VLORA_MODEL_DIR, "merged"), (VLORA_MODEL_DIR, "off")])
def test_what_it_says_before_loading_is_what_the_loaded_engine_says(model, mode):
    """info (backend, model, device, dtype and every detail), the vision LoRA and its mode, and the
    config: what the page is built from, against an engine loaded the ordinary way."""
    from webapp.common import engine_line

    deferred = create_engine("auto", str(model), defer=True, vision_lora=mode, **CPU)
    assert isinstance(deferred, DeferredEngine)
    before = (deferred.info, engine_line(deferred), engine_line(deferred, inspector=True), deferred.vision_mode,
              deferred.vision_lora is None, geometry(deferred.model_config()), deferred.context_window())
    assert not deferred.is_loaded
    loaded = create_engine("auto", str(model), vision_lora=mode, **CPU)
    assert before == (loaded.info, engine_line(loaded), engine_line(loaded, inspector=True), loaded.vision_mode,
                      loaded.vision_lora is None, geometry(loaded.model_config()), loaded.context_window())
    deferred.load()
    assert deferred.info == loaded.info and deferred.vision_mode == loaded.vision_mode


def test_the_page_is_built_without_loading_the_model_and_answers_as_a_loaded_engine(hf_engine):
    from webapp.layout import build_app

    deferred = create_engine("hf", str(BUNDLED_MODEL_DIR), defer=True, **CPU)
    build_app(deferred, str(BUNDLED_MODEL_DIR))
    assert not deferred.is_loaded
    messages = [Message("user", "What colour is the shape?", [make_image(96, 64, seed=3)])]
    settings = SamplingSettings(max_new_tokens=8)
    answer = deferred.generate(messages, settings)
    assert deferred.is_loaded
    reference = hf_engine.generate(messages, settings)
    assert (answer.token_ids, answer.text) == (reference.token_ids, reference.text)


@pytest.mark.parametrize("model, options", [
    ("assets/no-such-model", {}),
    (str(BUNDLED_MODEL_DIR), {"dtype": "float7"}),
    (str(VLORA_MODEL_DIR), {"vision_lora": "halfway"}),
    (str(BUNDLED_MODEL_DIR / "config.json"), {}),
])
def test_a_bad_model_or_setting_is_refused_before_anything_loads_in_the_same_words(model, options):
    with pytest.raises(G4VError) as deferred:
        create_engine("hf", model, defer=True, **options)
    with pytest.raises(G4VError) as loaded:
        create_engine("hf", model, **options)
    assert str(deferred.value) == str(loaded.value)
    assert "\n" not in str(deferred.value)


def test_weights_that_do_not_load_are_one_line_for_every_caller_and_loaded_once(tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(BUNDLED_MODEL_DIR, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    deferred = create_engine("hf", str(folder), defer=True, **CPU)  # the folder and its config are fine
    with pytest.raises(G4VError, match=r"^could not load model .*broken") as first:
        deferred.load()
    with pytest.raises(G4VError) as again:
        require(deferred, Instrumentable, "the test")
    assert str(again.value) == str(first.value) and "\n" not in str(first.value)


def test_a_load_that_fails_in_another_way_is_one_line_and_not_tried_again():
    """Out of memory (a RuntimeError from torch), Ctrl-C: the first caller sees it as it came,
    and every later caller gets one line naming the model, without a second load."""
    calls = []

    def load():
        calls.append(1)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore details")

    probe = create_engine("hf", str(BUNDLED_MODEL_DIR), defer=True, **CPU)
    deferred = DeferredEngine(load, probe.info, probe.outline)
    with pytest.raises(RuntimeError):
        deferred.load()
    for _ in range(2):
        with pytest.raises(G4VError, match=r"^could not load model .*: CUDA out of memory. Tried to allocate 2.00 GiB$"):
            deferred.generate([], SamplingSettings())
    assert calls == [1]


def test_requests_waiting_for_the_load_share_one_load():
    calls, started, release = [], threading.Event(), threading.Event()

    def load():
        calls.append(1)
        started.set()
        release.wait(10)
        return create_engine("hf", str(BUNDLED_MODEL_DIR), **CPU)

    probe = create_engine("hf", str(BUNDLED_MODEL_DIR), defer=True, **CPU)
    deferred = DeferredEngine(load, probe.info, probe.outline)
    windows = []
    waiting = [threading.Thread(target=lambda: windows.append(require(deferred, Instrumentable, "a test").tokenizer.model_max_length))
               for _ in range(3)]
    for thread in waiting:
        thread.start()
    assert started.wait(10)
    release.set()
    for thread in waiting:
        thread.join(60)
    assert calls == [1] and len(windows) == 3 and len(set(windows)) == 1 and deferred.is_loaded


def test_a_chat_sent_while_the_model_loads_is_told_so_once_and_then_answered(hf_engine):
    """The /chat endpoint of a page served before its model loads: the visitor gets one info toast
    (Gradio's log message) while the load holds their request, then the loaded engine's answer;
    a request after the load gets no toast."""
    import time

    from gradio_client import Client

    from tests.conftest import free_port
    from webapp.common import STILL_LOADING
    from webapp.layout import build_app

    release = threading.Event()
    probe = create_engine("hf", str(BUNDLED_MODEL_DIR), defer=True, **CPU)
    deferred = DeferredEngine(lambda: release.wait(60) and probe.load(), probe.info, probe.outline)
    demo = build_app(deferred, str(BUNDLED_MODEL_DIR))
    demo.queue()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        message = {"text": "What colour is the shape?", "files": []}
        job = client.submit(message, 8, 0.0, 1.0, 0, api_name="/chat")
        deadline = time.monotonic() + 60
        while job.status().log is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert job.status().log == (STILL_LOADING, "info") and not deferred.is_loaded
        release.set()
        text = job.result(timeout=120)
        assert text == hf_engine.generate([Message("user", message["text"])], SamplingSettings(max_new_tokens=8)).text
        again = client.submit(message, 8, 0.0, 1.0, 0, api_name="/chat")
        assert again.result(timeout=120) == text and again.status().log is None
    finally:
        release.set()
        demo.close()
