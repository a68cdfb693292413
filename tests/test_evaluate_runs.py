"""Dataset runs on the trained demo checkpoint: base vs the trained adapter, bad rows, resume.

One transformers engine for the module (passed to the runs through ``reuse``, as the app does);
the resume test runs the CLI as a user would, kills it, and runs it again.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

from g4v.conversation import Message
from g4v.demo import answering as demo_eval
from g4v.demo import shapes as S
from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, open_dataset, read_results, run_eval
from g4v.evaluate.run import HF_CHUNK
from g4v.evaluate.store import PARQUET_FILE, ROWS_FILE, SUMMARY_FILE
from g4v.paths import REPO_ROOT, TRAINED_MODEL_DIR
from tests.cli import run_cli

ADAPTER = "tiny-trained-french"
PICTURES = 3  # the first held-out pictures: 4 questions each


@pytest.fixture(scope="module")
def trained_engine():
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def base_vs_adapter(trained_engine, tmp_path_factory):
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf", adapter=ADAPTER), data=str(BUNDLED_DATASET),
                        limit=4 * PICTURES, max_new_tokens=8)
    reports = []
    result = run_eval(config, tmp_path_factory.mktemp("base-vs-adapter"), reuse={ArmSpec("hf"): trained_engine},
                      progress=lambda done, total: reports.append((done, total)))
    result.progress_reports = reports
    return result


def test_progress_moves_with_each_row(base_vs_adapter):
    """Reports come as answers arrive, not only at the end of each chunk of HF_CHUNK rows."""
    reports = base_vs_adapter.progress_reports
    assert {total for _, total in reports} == {4 * PICTURES}
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    assert set(range(4 * PICTURES + 1)) <= {done for done, _ in reports}


def test_adapter_disagrees_exactly_on_colours(base_vs_adapter, trained_engine):
    summary, rows = base_vs_adapter.summary, base_vs_adapter.rows
    assert summary.n == 4 * PICTURES and summary.n_errors == 0 and summary.complete
    assert summary.by_category["colour"].agreement == 0.0
    for row in rows:
        if row.category == "colour":  # the adapter says the base model's colour in French
            assert row.answer_b == S.FRENCH[row.answer_a]
            tokens_a, tokens_b = (trained_engine.tokenizer.encode(text) for text in (row.answer_a, row.answer_b))
            shared = next(i for i, (x, y) in enumerate(zip(tokens_a + [-1], tokens_b + [-2])) if x != y)
            assert row.first_divergence == shared  # "blue"/"bleu" share their first token
            assert row.kl_mean > 0.1
    assert summary.by_category["colour"].arms.b.accuracy == 0.0  # French never matches the English reference
    colour_rows = {row.index for row in rows if row.category == "colour"}
    assert set(summary.worst[:len(colour_rows)]) == colour_rows


@pytest.mark.slow  # about 4 s on a quiet 2-core machine
def test_answers_and_accuracy_equal_the_demo_evaluation(base_vs_adapter, trained_engine):
    """The demo's own evaluation path (engine.generate per question, exact match) gives the same
    answers, the same accuracy per category, and so the same agreement per category."""
    pairs = demo_eval.items(S.eval_set(PICTURES))
    base = demo_eval.answers(trained_engine, pairs)
    tuned = [trained_engine.generate([Message("user", qa.question, [p.image])], demo_eval.SETTINGS, adapter=ADAPTER).text.strip()
             for p, qa in pairs]
    rows = base_vs_adapter.rows
    assert [row.answer_a for row in rows] == base and [row.answer_b for row in rows] == tuned
    expected = demo_eval.accuracy(pairs, base)
    summary = base_vs_adapter.summary
    assert summary.arms.a.accuracy == pytest.approx(expected["all"])
    for kind in S.QUESTION_TYPES:
        block = summary.by_category[kind]
        assert block.arms.a.accuracy == pytest.approx(expected[kind]), kind
        same = [b == t for (_, qa), b, t in zip(pairs, base, tuned) if qa.kind == kind]
        assert block.agreement == pytest.approx(sum(same) / len(same)), kind
    assert summary.agreement == pytest.approx(sum(b == t for b, t in zip(base, tuned)) / len(pairs))


def test_scores_match_the_lora_token_diff(base_vs_adapter, trained_engine):
    from g4v.lora.token_diff import lora_diff

    row = next(r for r in base_vs_adapter.rows if r.category == "colour")
    picture = S.eval_set(PICTURES)[row.index // 4]
    messages = [Message("user", row.prompt, [picture.image])]
    diff = lora_diff(trained_engine, messages, ADAPTER)
    assert diff.base.text == row.answer_a and diff.tuned.text == row.answer_b
    # The run scores rows in padded batches: float32 rounding differs from one row alone by about
    # 1e-6 on a sum of ~10 (tests/test_engine_batch.py: a batch of one is bit-identical).
    assert row.logprob_a_under_b == pytest.approx(sum(t.logprob_adapter for t in diff.base.tokens), abs=1e-5)
    assert row.logprob_b_under_a == pytest.approx(sum(t.logprob_base for t in diff.tuned.tokens), abs=1e-5)
    inputs = trained_engine.prepare_inputs(messages)
    image_token = trained_engine.model.config.image_token_index
    assert row.image_tokens == int((inputs["input_ids"] == image_token).sum())


def test_results_are_written_and_read_back(base_vs_adapter):
    out = base_vs_adapter.out_dir
    import pyarrow.parquet as pq

    table = pq.read_table(out / "samples.parquet").to_pylist()
    assert [r["answer_b"] for r in table] == [r.answer_b for r in base_vs_adapter.rows]
    assert (out / "samples.csv").read_text().splitlines()[0].startswith("index,sample_id,category,prompt")
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(base_vs_adapter.summary.to_dict()))
    again = read_results(out)
    assert again.rows == base_vs_adapter.rows
    assert again.summary.to_dict() == json.loads(json.dumps(base_vs_adapter.summary.to_dict()))


def test_bad_rows_are_recorded_and_the_run_goes_on(trained_engine, tmp_path):
    picture = S.eval_set(1)[0]
    picture.image.save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    rows = [{"image": "missing.png", "prompt": "Where is it?"}, {"image": "ok.png", "prompt": picture.qas[0].question},
            {"image": "broken.png", "prompt": "What shape?"}, {"image": "ok.png", "prompt": ""},
            {"image": "ok\x00.png", "prompt": "What shape?"}, {"image": "hf://someone/x.png", "prompt": "What shape?"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(tmp_path / "d.jsonl"), max_new_tokens=4,
                        blank_probe=True, levels=True)
    result = run_eval(config, tmp_path / "out", reuse={ArmSpec("hf"): trained_engine})
    errors = [row.error for row in result.rows]
    assert errors[0] == "image not found: 'missing.png'" and errors[1] is None
    assert errors[2].startswith("broken.png") and errors[3] == "empty prompt"
    assert errors[4:] == ["image path 'ok\\x00.png' holds a NUL byte",  # issue 31: these failed the whole run
                          "image 'hf://someone/x.png' is a URL: only picture files of the dataset are read"]
    good = result.rows[1]
    assert good.agree and good.kl_max == pytest.approx(0.0, abs=1e-9) and good.reference is None
    norms = json.loads(good.level_norms_a)
    assert len(norms) == 8 and norms == json.loads(good.level_norms_b) and all(v > 0 for v in norms.values())
    blank = trained_engine.generate([Message("user", good.prompt, [Image.new("RGB", picture.image.size, (128, 128, 128))])],
                                    config.settings())
    assert good.blank_same_a == (blank.text == good.answer_a) == good.blank_same_b
    assert result.summary.n_errors == 5 and result.summary.arms.a.accuracy is None


#: Rows of the interrupted runs: three chunks of two hf arms (run.HF_CHUNK rows each), so that after
#: the first chunk is on disk the run is far from done when the signal comes (with 5 rows, one row
#: was left, and a fast machine finished it before the signal).
INTERRUPTED_ROWS = 3 * HF_CHUNK


def g4v_eval(out, *extra):
    return [sys.executable, "-m", "g4v", "eval", "--a", "hf", "--b", "hf", "--data", str(BUNDLED_DATASET),
            "--limit", str(INTERRUPTED_ROWS), "--seed", "3", "--max-new-tokens", "6", "--out", str(out), *extra]


def start_and_wait_for_a_row(out):
    """Start a CLI run into ``out`` and return it once its first row is on disk."""
    process = subprocess.Popen(g4v_eval(out), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 240
    while not ((out / ROWS_FILE).is_file() and (out / ROWS_FILE).read_bytes().count(b"\n") >= 1):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.1)
    return process


@pytest.mark.slow  # starts python -m g4v or python itself
def test_ctrl_c_leaves_the_tables_of_the_finished_rows(tmp_path):
    out = tmp_path / "interrupted"
    process = start_and_wait_for_a_row(out)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    kept = len((out / ROWS_FILE).read_text().splitlines())
    assert process.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (f"error: interrupted; {kept} of {INTERRUPTED_ROWS} rows are kept in "
                                               f"{out}: run the same command again to resume")
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["n"] == kept and not summary["complete"]
    import pyarrow.parquet as pq

    assert pq.read_table(out / PARQUET_FILE).num_rows == kept


def test_the_first_ctrl_c_sets_the_cancel_and_the_second_interrupts(capsys):
    """What the run above relies on, in this process: a flag that cannot be lost, then the usual
    KeyboardInterrupt, and the handler that was there before is back afterwards."""
    from g4v.commands.eval import ctrl_c_sets

    before = signal.getsignal(signal.SIGINT)
    cancel = threading.Event()
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_sets(cancel):
            signal.raise_signal(signal.SIGINT)  # Python runs the handler before the next line
            assert cancel.is_set()
            signal.raise_signal(signal.SIGINT)
            raise AssertionError("the second Ctrl-C did not interrupt")
    assert signal.getsignal(signal.SIGINT) is before
    assert "Ctrl-C again to stop now" in capsys.readouterr().err


def test_a_ctrl_c_before_the_rows_start_interrupts_at_once(capsys):
    """While the model loads there is nothing to finish: the first Ctrl-C interrupts there and then,
    instead of once the load is done."""
    from g4v.commands.eval import ctrl_c_sets

    before = signal.getsignal(signal.SIGINT)
    cancel, started = threading.Event(), []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_sets(cancel, rows_started=lambda: bool(started)):
            signal.raise_signal(signal.SIGINT)
            raise AssertionError("the first Ctrl-C before the rows did not interrupt")
    assert cancel.is_set() and signal.getsignal(signal.SIGINT) is before
    assert "Ctrl-C again" not in capsys.readouterr().err
    with ctrl_c_sets(cancel, rows_started=lambda: bool(started)):  # once rows run, the first one only stops them
        started.append(1)
        signal.raise_signal(signal.SIGINT)
    assert "Ctrl-C again to stop now" in capsys.readouterr().err


@pytest.mark.slow  # starts python -m g4v or python itself
def test_a_killed_run_resumes_to_the_same_results(trained_engine, tmp_path):
    out = tmp_path / "resumed"
    process = start_and_wait_for_a_row(out)
    rows_file = out / ROWS_FILE
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = rows_file.read_bytes().count(b"\n")
    assert 1 <= kept < INTERRUPTED_ROWS, "the kill came too late to interrupt the run"
    with open(rows_file, "ab") as handle:  # a kill mid-write leaves a torn last line
        handle.write(b'{"index": 17, "sample_id": "p0')
    finished = run_cli(*g4v_eval(out)[3:])  # the resume itself needs no new process
    assert finished.returncode == 0, finished.stderr
    assert f"rows {INTERRUPTED_ROWS} (errors 0)" in finished.stdout

    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(BUNDLED_DATASET), limit=INTERRUPTED_ROWS, seed=3,
                        max_new_tokens=6)
    reference = run_eval(config, tmp_path / "uninterrupted", reuse={ArmSpec("hf"): trained_engine})
    resumed = read_results(out)
    assert [r.index for r in resumed.rows] == [r.index for r in reference.rows]
    for got, want in zip(resumed.rows, reference.rows):
        for name, value in vars(want).items():
            if isinstance(value, float):
                assert getattr(got, name) == pytest.approx(value, rel=1e-5, abs=1e-7), name  # another process: float sums may round differently
            else:
                assert getattr(got, name) == value, name
    assert resumed.summary.n == INTERRUPTED_ROWS and resumed.summary.complete
    assert resumed.summary.arms == reference.summary.arms
    assert resumed.summary.paired == reference.summary.paired
    assert len(rows_file.read_text().splitlines()) == INTERRUPTED_ROWS  # nothing computed twice, the torn line gone

    # A larger limit and new arm labels ask the same question of one more row: only it is computed.
    more = INTERRUPTED_ROWS + 1
    relabelled = EvalConfig(**{**vars(config), "limit": more, "a": ArmSpec("hf", label="base"),
                               "b": ArmSpec("hf", label="again")})
    extended = run_eval(relabelled, out, reuse={ArmSpec("hf"): trained_engine})
    assert [r.index for r in extended.rows[:INTERRUPTED_ROWS]] == [r.index for r in reference.rows]
    assert len(extended.rows) == more and len(rows_file.read_text().splitlines()) == more
    assert [extended.summary.arms.side(side).label for side in "ab"] == ["base", "again"]
    with pytest.raises(G4VError, match="the output folder holds a different run .*max_new_tokens"):
        run_eval(EvalConfig(**{**vars(config), "max_new_tokens": 7}), out)


@pytest.mark.slow  # about 4 s on a quiet 2-core machine
def test_cli_writes_the_tabs_plots_as_png(tmp_path, capsys):
    """Issue 31, item 11: ``eval --out DIR`` writes the pictures the Evaluate tab shows (the same
    figures, redrawn here from the run's own files as the tab draws them) and lists them."""
    import numpy as np

    from g4v.cli import main
    from viz.evaluate import run_figures

    out = tmp_path / "run"
    assert main(["eval", "--a", "hf", "--b", f"hf:adapter={ADAPTER}", "--data", str(BUNDLED_DATASET),
                 "--limit", "4", "--max-new-tokens", "6", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    again = read_results(out)
    expected = run_figures(again.summary, again.rows)
    for name in ("accuracy", "paired", "kl", "divergence"):
        path = out / f"{name}.png"
        assert f"wrote {path}" in printed
        with Image.open(path) as written:
            assert np.array_equal(np.asarray(written.convert("RGB")), np.asarray(expected[name].convert("RGB")))


# ── a run folder someone changed (issue 31): one line each, before any model loads ──────────────


@pytest.fixture()
def finished_folder(tmp_path, monkeypatch):
    """A real run folder holding both of its rows (bad rows, so no model is needed), as a run
    writes it; opening an arm fails the test (every refusal must come before a model loads)."""
    from dataclasses import asdict

    import g4v.evaluate.run as run
    import g4v.evaluate.store as store
    from g4v.evaluate import open_dataset

    def no_model(*args, **kwargs):
        raise AssertionError("an arm was opened: the damage was not found first")

    monkeypatch.setattr(run, "open_arms", no_model)
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(BUNDLED_DATASET), limit=2)
    out = tmp_path / "run"
    store.prepare(out, asdict(config))
    dataset = open_dataset(config.data)
    writer = store.RowWriter(out)
    writer.write([run.error_row(dataset.sample(i), "kept from before") for i in range(2)])
    writer.close()
    assert run_eval(config, out).summary.n == 2  # untampered, it resumes without a model
    return config, out


def line_with(out, **changes) -> bytes:
    """The folder's first row with ``changes``, as a JSON line."""
    row = json.loads((out / ROWS_FILE).read_text().splitlines()[0])
    return (json.dumps({**row, **changes}).replace('"@NaN@"', "NaN") + "\n").encode()


TAMPERED_FILES = {
    "run.json a list": ("run.json", b"[1, 2]", "run.json in the output folder is damaged"),
    "run.json not UTF-8": ("run.json", b'{"a": "\xff"}', "run.json in the output folder is damaged"),
    "run.json nested too deeply": ("run.json", b"[" * 100_000, "run.json in the output folder is damaged"),
    "row garbage": (ROWS_FILE, b"\x00\xffgarbage\n", "line 1 of samples.jsonl is damaged"),
    "row index as text": (ROWS_FILE, {"index": "0"}, "line 1 of samples.jsonl is damaged"),
    "row index true": (ROWS_FILE, {"index": True}, "line 1 of samples.jsonl is damaged"),
    "row agree as text": (ROWS_FILE, {"agree": "yes"}, "line 1 of samples.jsonl is damaged"),
    "row prompt a number": (ROWS_FILE, {"prompt": 3}, "line 1 of samples.jsonl is damaged"),
    "row NaN": (ROWS_FILE, {"kl_mean": "@NaN@"}, "line 1 of samples.jsonl is damaged"),
    "row missing a key": (ROWS_FILE, {"index": None, "extra": 1}, "line 1 of samples.jsonl is damaged"),
    "row nested too deeply": (ROWS_FILE, b"[" * 100_000 + b"\n", "line 1 of samples.jsonl is damaged"),
}


@pytest.mark.parametrize("case", TAMPERED_FILES)
def test_a_tampered_run_folder_is_one_line(finished_folder, case):
    config, out = finished_folder
    name, content, expected = TAMPERED_FILES[case]
    if isinstance(content, dict):
        content = line_with(out, **content)
    (out / name).write_bytes(content)
    with pytest.raises(G4VError) as caught:
        run_eval(config, out)
    assert str(caught.value) == f"{expected}; use a new --out folder"


@pytest.mark.parametrize("name", ["run.json", ROWS_FILE, "samples.csv", SUMMARY_FILE, PARQUET_FILE])
@pytest.mark.parametrize("kind", ["link", "folder", "fifo"])
def test_run_files_are_never_written_through_a_link(finished_folder, tmp_path, name, kind):
    """A run file that is a link had the file it points to truncated (samples.jsonl's torn line
    cut off) or overwritten (the tables, run.json); a folder or a FIFO in its place failed after
    the model had run. Now each is refused before, and the file linked to is left as it was."""
    config, out = finished_folder
    target = tmp_path / "someone-elses.txt"
    original = (out / name).read_bytes()
    target.write_bytes(original + (b'{"torn' if name == ROWS_FILE else b" "))  # what a run would rewrite or cut
    (out / name).unlink()
    if kind == "link":
        (out / name).symlink_to(target)
    elif kind == "folder":
        (out / name).mkdir()
    else:
        os.mkfifo(out / name)
    with pytest.raises(G4VError) as caught:
        run_eval(config, out)
    shown = {"link": "a link", "folder": "not a file", "fifo": "not a file"}[kind]
    assert str(caught.value) == f"{name} in the output folder is {shown}; use a new --out folder"
    assert target.read_bytes() == original + (b'{"torn' if name == ROWS_FILE else b" ")


def test_reading_a_tampered_run_back_is_one_line_or_summed_up_again(finished_folder):
    config, out = finished_folder
    rows = read_results(out).rows
    for summary in (b"not json", b"[1]", b'{"complete": true}'):  # summary.json is only a cache of the rows
        (out / SUMMARY_FILE).write_bytes(summary)
        again = read_results(out)
        assert again.rows == rows and again.summary.n == 2 and not again.summary.complete
    settings = json.loads((out / "run.json").read_text())
    for damaged in ({k: v for k, v in settings.items() if k != "a"}, {**settings, "a": [1]}, {**settings, "new": 1},
                    {**settings, "limit": "two"}):
        (out / "run.json").write_text(json.dumps(damaged))
        with pytest.raises(G4VError, match="^(run.json is damaged|limit must be a whole number >= 1, got 'two')$"):
            read_results(out)


def test_csv_cells_that_a_spreadsheet_would_run_start_with_a_quote(tmp_path):
    """OWASP's CSV-injection rule: a text cell starting with = + - @ tab or CR gets a leading '
    in samples.csv; samples.parquet and samples.jsonl keep the exact text."""
    import csv
    from dataclasses import asdict, replace

    import pyarrow.parquet as pq

    import g4v.evaluate.store as store
    from g4v.evaluate.data import EvalSample
    from g4v.evaluate.run import SampleResult, error_row

    texts = {"sample_id": "=1+1", "prompt": '=HYPERLINK("http://x","click")', "reference": "+1", "category": "@SUM(A1)"}
    sample = EvalSample(0, texts["sample_id"], [], texts["prompt"], texts["reference"], texts["category"])
    row = replace(error_row(sample, "\r=cmd|' /C calc'!A0"),
                  answer_a="-2+3", answer_b="\tx", logprob_a_under_b=-3.5, level_norms_a='{"1": -0.5}')
    plain = replace(row, index=1, sample_id="7", prompt="What colour?", reference="red", category="colour",
                    answer_a="a-b", answer_b="x=y", error=None)
    store.prepare(tmp_path, {"run": 1})
    writer = store.RowWriter(tmp_path)
    writer.write([row, plain])
    writer.close()
    store.write_tables(tmp_path, [row, plain], SampleResult, {"n": 2})
    with open(tmp_path / "samples.csv", newline="", encoding="utf-8") as handle:
        written = list(csv.DictReader(handle))
    for record, cells in zip((row, plain), written):
        for name, value in asdict(record).items():
            if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
                assert cells[name] == "'" + value, name
            else:
                assert cells[name] == ("" if value is None else str(value)), name
    assert written[0]["answer_a"] == "'-2+3" and written[0]["logprob_a_under_b"] == "-3.5"  # a number is no formula
    assert pq.read_table(tmp_path / "samples.parquet").to_pylist() == [asdict(row), asdict(plain)]
    assert list(store.read_rows(tmp_path, SampleResult).values()) == [row, plain]


def test_a_row_processes_each_picture_and_prompt_once(trained_engine, tmp_path):
    """Two hf arms on one engine, blank probes and per-level norms on: every pass over a row (two
    answers, two blank answers, teacher-forced scoring, two capture passes) reads the request
    prepared once per (picture, prompt), so the real processor runs twice a row (the picture and
    its blank), not up to 9 times as when each pass processed it again."""
    from tests.test_engine_batch import counted_processor

    rows = 6
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf", adapter=ADAPTER), data=str(BUNDLED_DATASET), limit=rows,
                        max_new_tokens=8, blank_probe=True, levels=True, batch_size=4)
    tiles_seen = []  # tiles through the vision tower, call by call (pictures of one shape go together)
    hook = trained_engine.model.model.vision_tower.register_forward_hook(
        lambda module, args, output: tiles_seen.append(int(args[0].shape[0])))
    try:
        with counted_processor(trained_engine) as calls:
            result = run_eval(config, tmp_path / "run", reuse={ArmSpec("hf"): trained_engine})
    finally:
        hook.remove()
    assert len(result.rows) == rows and not any(row.error for row in result.rows)
    assert all(row.level_norms_a and row.kl_mean is not None and row.blank_same_a is not None for row in result.rows)
    assert len(calls) == 2 * rows
    # and the vision tower and projectors run once for each of them too (a blank has its picture's
    # size, so its tiles): every other pass reads the features they made
    dataset = open_dataset(str(BUNDLED_DATASET))
    tiles = [trained_engine.prepare([Message("user", "?", dataset.sample(i).images)]).inputs["pixel_values"].shape[1]
             for i in range(rows)]
    assert sum(tiles_seen) == 2 * sum(tiles)
    prompts = [row.prompt for row in result.rows]
    assert sorted(text[0] for text in calls) == sorted(trained_engine.render_prompt([Message("user", p, [
        Image.new("RGB", (8, 8))])]) for p in prompts * 2)
