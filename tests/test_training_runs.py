"""Reading training runs: a Trainer's ``trainer_state.json``, its TensorBoard events (written by
torch's own ``SummaryWriter`` as the Trainer's TensorBoard callback writes them, read back by
TensorBoard's reader) and the demo trainer's log give the same records; run folders only from the
run folders; each bad folder is one line from ``python -m g4v training``."""

import json
import os

import pytest

from g4v.cli import main as cli_main
from g4v.errors import G4VError
from g4v.paths import TRAINED_MODEL_DIR
from g4v.training.log_file import LOG_FILE, write_log
from g4v.training.records import COLLAPSE, LevelRecord, Record, check_levels
from g4v.training.report import open_run, summary_rows
from g4v.training.runs import list_runs, resolve_run
from g4v.training.settings import MonitorSettings
from tests.test_figure_text import drawn  # noqa: F401 (the fixture: what matplotlib draws)

LEVELS = ["deepstack0", "deepstack1", "deepstack2", "deepstack3", "spatial_TL", "spatial_TR", "spatial_BL", "spatial_BR"]


def records() -> list[Record]:
    """Three records whose numbers follow a rule (deepstack1 collapses at step 20), alerts from the rule book."""
    made, previous = [], {}
    for step in (1, 10, 20):
        levels = [LevelRecord(name, injected_norm=1.0 + i + step / 100, residual_norm=2.0 + i, dominant_share=i / 8,
                              grad_norm=0.01 * (i + 1), update_norm=0.5 / step)
                  for i, name in enumerate(LEVELS)]
        if step == 20:
            levels[1].injected_norm = 1e-4
        for level in levels:
            level.ratio = level.injected_norm / level.residual_norm
        made.append(Record(step, levels, {"q_proj": 0.1 * step}, check_levels(step, levels, previous, MonitorSettings())))
        previous = {level.name: level for level in levels}
    return made


def entries(made: list[Record]) -> list[dict]:
    return [{"step": r.step, "loss": 3.0 - r.step / 10, **r.to_logs()} for r in made]


@pytest.fixture()
def roots(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    return root


def write_state(folder, made):
    folder.mkdir(parents=True)
    # sorted keys, as the Trainer writes it: the levels come back in the model's order all the same
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": entries(made)}, sort_keys=True))


def write_events(folder, made, tags=None):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / "runs" / "Dec05_12-00-00_host"))
    for entry in entries(made):
        for key, value in entry.items():
            if key != "step" and (tags is None or key in tags):
                writer.add_scalar("train/" + key, value, entry["step"])  # the Trainer's callback adds train/
    writer.close()


def test_the_three_sources_read_the_same_records(roots):
    made = records()
    write_state(roots / "state", made)
    write_events(roots / "events", made)
    (roots / "log").mkdir()
    write_log(roots / "log" / LOG_FILE, "granite4_vision", LEVELS, MonitorSettings(), entries(made))
    expected = [r.to_dict() for r in made]
    assert made[-1].alerts and made[-1].alerts[0].kind == COLLAPSE and made[-1].alerts[0].level == "deepstack1"
    for name, tolerance in (("state", 0), ("log", 2e-6), ("events", 1e-6)):  # the log keeps 6 digits
        curves = open_run(name, [roots])
        assert curves.levels == LEVELS, name
        got = [r.to_dict() for r in curves.records]
        assert [r["step"] for r in got] == [1, 10, 20]
        for a, b in zip(got, expected):
            assert [alert["level"] for alert in a["alerts"]] == [alert["level"] for alert in b["alerts"]]
            assert a["lora"] == pytest.approx(b["lora"], rel=tolerance)
            for x, y in zip(a["levels"], b["levels"]):
                assert {k: v for k, v in x.items() if k != "name"} == pytest.approx(
                    {k: v for k, v in y.items() if k != "name"}, rel=tolerance), name
        assert curves.loss == pytest.approx({1: 2.9, 10: 2.0, 20: 1.0}, rel=1e-6)
        rows = summary_rows(curves)
        assert rows[1][0] == "deepstack1" and rows[1][-1] == "1 (collapse)" and rows[0][-1] == "0"


def test_runs_are_listed_and_resolved_only_inside_the_run_folders(roots, tmp_path):
    made = records()
    write_state(roots / "team" / "a", made)
    (roots / "team" / "a" / "checkpoint-10").mkdir()  # not a run of its own
    outside = tmp_path / "elsewhere"
    write_state(outside, made)
    os.symlink(outside, roots / "link")
    assert list_runs([roots]) == ["team/a"]  # links are not followed when listing
    assert resolve_run("team/a", [roots]) == ("team/a", (roots / "team" / "a").resolve())
    for typed in (str(outside), "link", "../elsewhere", "team/../../elsewhere"):
        with pytest.raises(G4VError, match="outside the run folders"):
            resolve_run(typed, [roots])
    with pytest.raises(G4VError, match="run folder not found"):
        resolve_run("team/b", [roots])


def one_line_error(capsys, *args) -> str:
    assert cli_main(["training", *args]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


def test_bad_run_folders_are_one_line_each(roots, tmp_path, capsys):
    dirs = ["--runs-dir", str(roots)]
    (roots / "empty").mkdir()
    assert "holds no training log, trainer_state.json, TensorBoard events or checkpoints" in \
        one_line_error(capsys, "empty", *dirs)
    (roots / "corrupt").mkdir()
    (roots / "corrupt" / "trainer_state.json").write_text('{"log_history": [{"step": 1,')
    assert "trainer_state.json is not valid JSON (line 1)" in one_line_error(capsys, "corrupt", *dirs)
    (roots / "badlog").mkdir()
    (roots / "badlog" / LOG_FILE).write_text('{"format": "something else"}\n')
    assert "does not start with a g4v-training-log/1 header" in one_line_error(capsys, "badlog", *dirs)
    write_events(roots / "other", records(), tags={"loss", "learning_rate"})  # a run of another model
    said = one_line_error(capsys, "other", *dirs)
    assert "TensorBoard events hold no Deepstack metrics" in said and "another model's run" in said
    (roots / "other_log").mkdir()
    write_log(roots / "other_log" / LOG_FILE, "llava", LEVELS, MonitorSettings(), [])
    assert "training log is of a 'llava' model" in one_line_error(capsys, "other_log", *dirs)
    said = one_line_error(capsys, str(tmp_path), *dirs)
    assert "is outside the run folders (runs)" in said
    assert "no such run" not in said and str(tmp_path) not in said.replace(repr(str(tmp_path)), "")
    assert "run folder not found" in one_line_error(capsys, "missing", *dirs)


def test_the_command_prints_the_table_json_and_the_picture(roots, tmp_path, capsys):
    from PIL import Image

    write_state(roots / "state", records())
    out = tmp_path / "curves.png"
    assert cli_main(["training", "state", "--runs-dir", str(roots), "--png", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 records from the Trainer's trainer_state.json, steps 1-20, 1 warning" in printed
    assert "step 20: deepstack1 collapse: injected / residual norm 3.33e-05" in printed
    assert printed.endswith("\nThis run keeps no checkpoints.\nwrote " + str(out) + "\n")
    with Image.open(out) as picture:
        assert picture.width >= 800 and picture.height >= 800
    assert cli_main(["training", "state", "--runs-dir", str(roots), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(open_run("state", [roots]).to_dict()))
    assert cli_main(["training", "state", "--runs-dir", str(roots), "--png", str(tmp_path / "no" / "x.png")]) == 1
    assert "--png must name a file in an existing folder" in capsys.readouterr().err


def test_the_pictures_text_is_readable_and_their_legends_clear(roots, drawn):
    """Every text at least MIN_TEXT_PX once the page shows the picture, no legend over the data;
    a warning is marked where it was raised."""
    from tests.test_figure_text import legends_clear_of_the_data, smallest_shown_text
    from viz.figures import MIN_TEXT_PX
    from viz.training import curves_figure, steps_figure

    write_state(roots / "state", records())
    data = open_run("state", [roots]).to_dict()
    curves_figure(data)
    smallest, text = smallest_shown_text(drawn)
    assert smallest >= MIN_TEXT_PX, text
    figure = drawn["figures"][-1]
    legends_clear_of_the_data(figure)
    ratio_axes = figure.axes[0]
    marked = [line for line in ratio_axes.get_lines() if line.get_marker() == "v" and list(line.get_xdata()) == [20]]
    assert marked and marked[0].get_ydata()[0] == pytest.approx(data["records"][2]["levels"][1]["ratio"])
    views = [{"step": r["step"], "levels": r["levels"]} for r in data["records"][:2]]
    steps_figure(views, "state")
    assert smallest_shown_text(drawn)[0] >= MIN_TEXT_PX
    legends_clear_of_the_data(drawn["figures"][-1])


def test_the_status_counts_checkpoints_and_records_in_words(roots, capsys):
    """The trained demo run keeps one checkpoint (itself, at its log's last step): the tab and the
    command say how many and at which step, not the step alone as if it were a count; measured, one record from
    one checkpoint on one picture, in the singular. Two checkpoints (copies of that model) are
    listed by step, and measured they are counted in the plural."""
    import shutil

    from g4v.training.measure import default_probe
    from g4v.training.report import headline
    from webapp.training import DEMO_RUN, status_text

    demo = TRAINED_MODEL_DIR
    last_step = json.loads(demo.joinpath(LOG_FILE).read_text().strip().splitlines()[-1])["step"]
    assert status_text(open_run(DEMO_RUN)).endswith(f"\n\nCheckpoints kept: 1, at step {last_step}.")
    assert cli_main(["training", DEMO_RUN, "--runs-dir", str(demo.parent)]) == 0
    assert capsys.readouterr().out.endswith(f"\nCheckpoints kept: 1, at step {last_step}.\n")
    measured = open_run(DEMO_RUN, measure=True, probe=default_probe()[:1], device="cpu")
    assert headline(measured) == (f"run '{DEMO_RUN}': 1 record from 1 checkpoint measured on 1 probe picture, "
                                  f"step {last_step}, no warnings")

    for step in (700, 350):
        shutil.copytree(demo, roots / "two" / f"checkpoint-{step}", ignore=shutil.ignore_patterns(LOG_FILE))
    assert status_text(open_run("two", [roots], measure=True, probe=default_probe()[:2], device="cpu")) == (
        "**run 'two': 2 records from 2 checkpoints measured on 2 probe pictures, steps 350-700, no warnings**"
        "\n\nCheckpoints kept: 2, at steps 350, 700.")
