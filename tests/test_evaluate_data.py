"""Datasets for dataset runs: the formats ``datasets`` reads, the bundled dataset, and bad input.

A bad dataset or mapping is one line before any model loads (API and CLI); a bad row is recorded
on that row. No model is loaded here except where the CLI is asked for a bad adapter (refused
before loading).
"""

import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from PIL import Image

from g4v.demo import shapes as S
from g4v.demo.dataset import PICTURES, build_dataset
from g4v.errors import G4VError
from g4v.evaluate import BUNDLED_DATASET, Columns, open_dataset
from tests.cli import run_cli


def sha256_tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_bundled_dataset_rebuilds_byte_for_byte(tmp_path):
    assert sha256_tree(build_dataset(tmp_path / "rebuilt")) == sha256_tree(BUNDLED_DATASET)


def test_bundled_dataset_holds_the_held_out_pictures_and_questions():
    dataset = open_dataset(str(BUNDLED_DATASET))
    assert len(dataset) == 4 * PICTURES
    assert dataset.columns == Columns(image="file_name", prompt="prompt", reference="answer", category="category", id="id")
    pictures = S.eval_set(3)
    for picture_index in range(3):
        for k, qa in enumerate(pictures[picture_index].qas):
            sample = dataset.sample(4 * picture_index + k)
            assert sample.error is None
            assert (sample.prompt, sample.reference, sample.category) == (qa.question, qa.answer, qa.kind)
            assert list(sample.images[0].getdata()) == list(pictures[picture_index].image.getdata())  # lossless
            assert Path(sample.image_paths[0]).is_file()
    total = sum(p.stat().st_size for p in BUNDLED_DATASET.rglob("*") if p.is_file())
    assert total < 1_000_000


def picture(path: Path, colour=(200, 30, 30)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 30), colour).save(path)
    return path.name


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.fixture()
def table(tmp_path) -> Path:
    """A JSONL file with four good rows in other column names, and bad rows after them."""
    picture(tmp_path / "pics" / "a.png")
    picture(tmp_path / "pics" / "b.png", (20, 20, 200))
    (tmp_path / "pics" / "broken.png").write_bytes(b"not a picture at all")
    rows = [
        {"img": "pics/a.png", "question": "What colour?", "gold": "red", "kind": "colour"},
        {"img": ["pics/a.png", "pics/b.png"], "question": "Two?", "gold": "yes", "kind": "count"},
        {"img": "pics/missing.png", "question": "Where?", "gold": "left", "kind": "position"},
        {"img": "pics/broken.png", "question": "Shape?", "gold": "star", "kind": "shape"},
        {"img": "pics/a.png", "question": "   ", "gold": "x", "kind": "colour"},
        {"img": ["pics/a.png"] * 5, "question": "Many?", "gold": "five", "kind": "count"},
        {"img": None, "question": "No picture?", "gold": "no", "kind": "count"},
    ]
    return write_jsonl(tmp_path / "data.jsonl", rows)


def test_jsonl_with_a_column_mapping_and_bad_rows(table):
    dataset = open_dataset(str(table), Columns.parse("image=img,prompt=question,reference=gold,category=kind"))
    assert len(dataset) == 7
    good = dataset.sample(0)
    assert good.error is None and good.images[0].size == (40, 30) and good.reference == "red"
    assert len(dataset.sample(1).images) == 2
    errors = [dataset.sample(i).error for i in range(2, 7)]
    assert errors == ["image not found: 'pics/missing.png'", "broken.png is not an image (unrecognised format)",
                      "empty prompt", "5 images in one row, at most 4", "no image in this row"]
    for i in range(2, 7):
        assert dataset.sample(i).images == []  # a bad row never carries half its pictures


def test_csv_parquet_and_saved_dataset_load_the_same_rows(tmp_path):
    import datasets

    name = picture(tmp_path / "p.png")
    rows = [{"image": name, "prompt": "What colour?", "answer": "red", "id": "s1"}]
    (tmp_path / "d.csv").write_text("image,prompt,answer,id\np.png,What colour?,red,s1\n")
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    saved = datasets.Dataset.from_dict({"image": [str(tmp_path / "p.png")], "question": ["What colour?"]})
    saved.cast_column("image", datasets.Image()).save_to_disk(str(tmp_path / "saved"))
    for source in ("d.csv", "d.parquet", "saved"):
        sample = open_dataset(str(tmp_path / source)).sample(0)
        assert sample.error is None and sample.prompt == "What colour?", source
        assert list(sample.images[0].getdata())[0] == (200, 30, 30)
    assert open_dataset(str(tmp_path / "d.csv")).sample(0).sample_id == "s1"


def test_csv_cells_are_read_as_written(tmp_path):
    """pandas would read a column of numbers with one empty cell as floats (3 -> 3.0), which no
    answer "3" could match."""
    picture(tmp_path / "p.png")
    rows = "p.png,How many?,3\np.png,How many?,\np.png,Code?,007\np.png,Which?,None\np.png,Which?,NA\n"
    (tmp_path / "counts.csv").write_text("image,prompt,answer\n" + rows)
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbf" + ("image,prompt,answer,\n" + rows.replace("\n", ",\n")).encode())
    for name in ("counts.csv", "excel.csv"):  # the second: Excel's byte-order mark, a trailing comma
        dataset = open_dataset(str(tmp_path / name))
        assert [dataset.sample(i).reference for i in range(5)] == ["3", None, "007", "None", "NA"], name
        assert dataset.sample(0).error is None and dataset.sample(0).prompt == "How many?"


def refused(source, columns=None, data_dirs=None) -> str:
    with pytest.raises(G4VError) as err:
        open_dataset(str(source), columns, data_dirs)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_dataset_without_a_guessable_column_is_described_but_not_run(tmp_path):
    """Without a column named or guessed for a required role, a dataset is refused for a run, but
    can be opened to describe it (``required=()``: the role is None, its columns listed), so the
    app can ask its visitor to name the column instead of turning the dataset away."""
    source = write_jsonl(tmp_path / "pictures.jsonl", [{"picture": "a.png", "question": "What?"}] * 3)
    assert refused(source) == "no image column found (columns: picture, question); name it with --columns image=COLUMN"
    described = open_dataset(str(source), None, required=())
    assert (len(described), described.column_names) == (3, ["picture", "question"])
    assert described.columns == Columns(image=None, prompt="question")
    assert open_dataset(str(source), Columns(image="picture")).columns == Columns(image="picture", prompt="question")


def test_bad_datasets_are_one_line(tmp_path, table):
    assert "dataset not found" in refused(tmp_path / "nowhere.jsonl")
    # a mistyped relative path of the Hub's owner/name shape: found missing at once, not looked up
    assert refused("data/my.jsonl") == "dataset not found: 'data/my.jsonl'"
    (tmp_path / "folder").mkdir()
    assert "is not a dataset" in refused(tmp_path / "folder")
    (tmp_path / "notes.txt").write_text("hello")
    assert "not a dataset file" in refused(tmp_path / "notes.txt")
    assert "column 'q' (for prompt) is not in the dataset" in refused(table, Columns(prompt="q"))
    assert "no prompt column found" in refused(write_jsonl(tmp_path / "noprompt.jsonl", [{"image": "a.png"}]))
    assert refused(write_jsonl(tmp_path / "empty.jsonl", [])) == "dataset empty.jsonl has no rows"
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"image": "a.png", "prompt": "p"}, '{"image": "a.png", "pro'])
    assert refused(broken) == "line 2 of broken.jsonl is not valid JSON"
    assert refused(write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])) == "line 1 of list.jsonl is not a JSON object"
    (tmp_path / "empty.csv").write_text("")
    assert refused(tmp_path / "empty.csv") == "dataset empty.csv has no rows"
    # issue 31: a JSON line nested past Python's recursion limit, a CSV or JSON file in Latin-1
    deep = write_jsonl(tmp_path / "deep.jsonl", [{"image": "a.png", "prompt": "p"},
                                                 '{"image": ' + "[" * 100_000 + "]" * 100_000 + ', "prompt": "p"}'])
    assert refused(deep) == "line 2 of deep.jsonl is nested too deeply"
    (tmp_path / "latin1.csv").write_bytes("image,prompt\na.png,caf\u00e9?\n".encode("latin-1"))
    assert refused(tmp_path / "latin1.csv") == "latin1.csv is not UTF-8 text"
    (tmp_path / "latin1.json").write_bytes('[{"image": "a.png", "prompt": "caf\u00e9?"}]'.encode("latin-1"))
    assert refused(tmp_path / "latin1.json") == "latin1.json is not UTF-8 text"


def test_data_dirs_confine_the_dataset_and_its_pictures(tmp_path):
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    picture(outside / "secret.png")
    write_jsonl(outside / "d.jsonl", [{"image": "secret.png", "prompt": "p"}])
    data.mkdir()
    write_jsonl(data / "escape.jsonl",
                [{"image": "../outside/secret.png", "prompt": "p"}, {"image": str(outside / "secret.png"), "prompt": "p"},
                 {"image": "inside.png", "prompt": "p"}, {"image": "link.png", "prompt": "p"}])
    picture(data / "inside.png")
    (data / "link.png").symlink_to(outside / "secret.png")
    (data / "linked").symlink_to(outside)
    # the dataset itself: outside, through a link, or by a relative climb
    shown = re.fullmatch(r"dataset '(.+)' is outside the data folders", refused(outside / "d.jsonl", data_dirs=[data]))
    # the path as given, or its start when it is long (a pytest-xdist worker's tmp_path is)
    assert shown and (shown[1] == str(outside / "d.jsonl") or str(outside / "d.jsonl").startswith(shown[1].removesuffix("...")))
    assert "outside the data folders" in refused("linked/d.jsonl", data_dirs=[data])
    assert "outside the data folders" in refused("../outside/d.jsonl", data_dirs=[data])
    # its pictures: only inside the dataset's folder, links resolved
    dataset = open_dataset("escape.jsonl", data_dirs=[data])
    errors = [dataset.sample(i).error for i in range(4)]
    assert errors[0] == "image '../outside/secret.png' is outside the dataset's folder"
    assert "is outside the dataset's folder" in errors[1] and str(tmp_path) not in errors[1][-40:]
    assert errors[2] is None
    assert errors[3] == "image 'link.png' is outside the dataset's folder"
    # without data_dirs (the CLI, the user's own files) the same dataset reads its pictures anywhere
    assert open_dataset(str(data / "escape.jsonl")).sample(0).error is None


@contextmanager
def hub_offline():
    """``HF_HUB_OFFLINE=1`` for a run in this process: the Hub libraries read it once, at import."""
    import datasets
    import huggingface_hub

    with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}), \
            mock.patch.object(huggingface_hub.constants, "HF_HUB_OFFLINE", True), \
            mock.patch.object(datasets.config, "HF_HUB_OFFLINE", True):
        yield


def g4v_eval(*args, out: Path):
    with hub_offline():
        return run_cli("eval", "--out", str(out), *args)


@pytest.mark.parametrize("args,expected", [
    (["--a", "hf", "--b", "torch", "--data", str(BUNDLED_DATASET)], "error: arm 'torch': backend must be one of"),
    (["--a", "hf", "--b", "hf:adapter=no-such-adapter", "--data", str(BUNDLED_DATASET)], "error: unknown adapter 'no-such-adapter'"),
    (["--a", "hf", "--b", "hf", "--data", str(BUNDLED_DATASET), "--columns", "prompt=question"],
     "error: column 'question' (for prompt) is not in the dataset"),
    (["--a", "hf", "--b", "hf", "--data", "no/such/folder/d.jsonl"], "error: dataset not found"),
    (["--a", "hf", "--b", "hf", "--data", "nobody-here/no-such-dataset"],
     "error: cannot load 'nobody-here/no-such-dataset' from the Hugging Face Hub"),
])
def test_cli_refuses_in_one_line_before_loading_a_model(tmp_path, args, expected):
    result = g4v_eval(*args, out=tmp_path / "out")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert lines[-1].startswith(expected), lines
    assert "Traceback" not in result.stderr and "Loading weights" not in result.stderr
    assert not any(line.startswith("error") for line in lines[:-1])


# ── the output folder and the arms are checked before a run folder is started ──────────────────


def _config(**arms):
    from g4v.evaluate import ArmSpec, EvalConfig

    return EvalConfig(a=arms.get("a", ArmSpec("hf")), b=arms.get("b", ArmSpec("hf")), data=str(BUNDLED_DATASET),
                      limit=1)


def test_out_naming_a_file_is_one_line(tmp_path):
    from g4v.evaluate import run_eval

    target = tmp_path / "results"
    target.write_text("not a folder")
    with pytest.raises(G4VError, match="is a file") as caught:
        run_eval(_config(), target)
    assert str(tmp_path) not in str(caught.value)
    assert target.read_text() == "not a folder"


@pytest.mark.parametrize("name", ["samples.csv", "summary.json", "samples.parquet"])
def test_out_holding_someone_elses_results_is_refused_untouched(tmp_path, name):
    from g4v.evaluate import run_eval

    (tmp_path / name).write_text("theirs")
    with pytest.raises(G4VError, match=f"has {name} but no run.json"):
        run_eval(_config(), tmp_path)
    assert (tmp_path / name).read_text() == "theirs"
    assert not (tmp_path / "run.json").exists()


@pytest.mark.parametrize("arm", ["hf:adapter=no-such-adapter", "hf:adapter=../../etc", "hf:model=/etc"])
def test_a_bad_arm_leaves_no_run_folder_behind(tmp_path, arm):
    """Refused before ``run.json`` is written, so the corrected command may use the same --out."""
    from g4v.evaluate import ArmSpec, run_eval

    out = tmp_path / "run"
    with pytest.raises(G4VError):
        run_eval(_config(b=ArmSpec.parse(arm)), out)
    assert not (out / "run.json").exists()


def test_an_unreachable_hub_dataset_is_one_line_without_retry_noise(monkeypatch, capfd):
    import datasets
    from huggingface_hub.utils import logging as hub_logging

    def offline(*args, **kwargs):  # what the Hub client does offline: log each retry, then give up
        hub_logging.get_logger("huggingface_hub.utils._http").warning(
            "Retrying in 8s [Retry 5/5]. HEAD https://huggingface.co/datasets/someone/nothing")
        raise ConnectionError("Couldn't reach someone/nothing on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(G4VError, match="cannot load 'someone/nothing' from the Hugging Face Hub"):
        open_dataset("someone/nothing")
    assert "Retrying" not in capfd.readouterr().err


def test_a_vllm_arm_reserves_lora_slots_only_for_an_adapter():
    """vLLM runs its LoRA kernels on every step once slots exist, so a base arm starts without."""
    from g4v.engines.vllm_server import server_command
    from g4v.evaluate.arms import vllm_settings

    base = server_command("model", 8000, vllm_settings([]), "served")
    with_adapter = server_command("model", 8000, vllm_settings(["french"]), "served", {"french": "/adapters/fr"})
    assert "--enable-lora" not in base and "--lora-modules" not in base
    assert "--enable-lora" in with_adapter and with_adapter[with_adapter.index("--lora-modules") + 1] == "french=/adapters/fr"


# ── files a dataset names: only its own, never through datasets (issue 31: H6, H7, M2) ─────────


def save_rows(folder: Path, prompts: list[str], dict_split: str | None = None) -> Path:
    """A real ``save_to_disk`` folder (a DatasetDict with one split when ``dict_split``)."""
    import datasets

    rows = datasets.Dataset.from_dict({"image": ["p.png"] * len(prompts), "prompt": prompts})
    (datasets.DatasetDict({dict_split: rows}) if dict_split else rows).save_to_disk(str(folder))
    picture(folder / "p.png")
    return folder


ARROW = "data-00000-of-00001.arrow"


@pytest.mark.parametrize("tamper", ["climbs out", "absolute", "/etc/passwd", "names a link", "data file is a link",
                                    "split climbs out"])
def test_a_saved_dataset_reads_only_its_own_files(tmp_path, tamper):
    """``load_from_disk`` joins state.json's file names (and dataset_dict.json's splits) onto the
    folder: a tampered upload loaded another saved dataset on the server into the sample table."""
    uploads = tmp_path / "uploads"
    theirs = save_rows(tmp_path / "theirs", ["someone else's row"])
    mine = save_rows(uploads / "mine", ["my row"], dict_split="test" if tamper == "split climbs out" else None)
    assert open_dataset("mine", data_dirs=[uploads]).sample(0).prompt == "my row"  # untampered, it loads
    state_file = mine / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else None
    names = {"climbs out": f"../../theirs/{ARROW}", "absolute": str(theirs / ARROW), "/etc/passwd": "/etc/passwd",
             "names a link": "link.arrow"}
    if tamper in names:
        state["_data_files"] = [{"filename": names[tamper]}]
        state_file.write_text(json.dumps(state))
    if tamper == "names a link":
        (mine / "link.arrow").symlink_to(theirs / ARROW)
    if tamper == "data file is a link":
        (mine / ARROW).unlink()
        (mine / ARROW).symlink_to(theirs / ARROW)
    if tamper == "split climbs out":
        (mine / "dataset_dict.json").write_text(json.dumps({"splits": ["../../theirs"]}))
    message = refused("mine", data_dirs=[uploads])
    assert message.startswith("the saved dataset 'mine' (") and message.endswith("only its own files are read")
    assert str(tmp_path) not in message and "etc" not in message
    # the CLI (no data folders) refuses the same: a saved dataset's files are its own
    assert refused(mine).endswith("only its own files are read")


def test_damaged_saved_dataset_files_are_one_line(tmp_path):
    mine = save_rows(tmp_path / "mine", ["my row"])
    for text, expected in [("[1]", "state.json is not a JSON object"),
                           ('{"_data_files": "x"}', "state.json lists no data files"),
                           ('{"_data_files": [{"filename": "gone.arrow"}]}', "that data file is missing"),
                           ("[" * 100_000, "state.json is not a JSON object")]:
        (mine / "state.json").write_text(text)
        assert refused(mine).endswith(expected), text


def parquet_with_image_feature(path: Path, picture_paths: list[str]) -> Path:
    """A Parquet table whose ``image`` column is a ``datasets.Image`` feature holding only paths,
    written with pyarrow (``Dataset.to_parquet`` itself would look the paths up)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = datasets.Features({"image": datasets.Image(), "prompt": datasets.Value("string")})
    images = pa.array([{"bytes": None, "path": p} for p in picture_paths], features.arrow_schema.field("image").type)
    table = pa.table({"image": images, "prompt": ["What colour?"] * len(picture_paths)})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features.to_dict()}})})
    pq.write_table(table, path)
    assert datasets.load_dataset("parquet", data_files=str(path), split="train", keep_in_memory=True,
                                 cache_dir=str(path.parent / "check")).features["image"] == datasets.Image()
    return path


def test_picture_paths_in_an_image_feature_are_the_rows_never_datasets(tmp_path, monkeypatch):
    """``datasets`` decoding an ``Image`` feature opens its path itself, any fsspec URL included:
    an outside picture was served, ``hf://`` went out with the server's token, ``file://`` and
    ``zip::`` failed the whole run. Now each such row is refused before ``datasets`` is asked."""
    import socket

    import datasets

    asked = []
    monkeypatch.setattr(datasets.Image, "decode_example", lambda self, *a, **k: asked.append(a) or 1 / 0)
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: asked.append(address) or 1 / 0)
    data, outside = tmp_path / "uploads", tmp_path / "outside"
    picture(data / "inside.png")
    picture(outside / "secret.png", (9, 9, 9))
    paths = ["inside.png", str(outside / "secret.png"), "hf://x/y.png", "http://127.0.0.1:1/a.png",
             "file:///etc/hostname", "memory://a.png", "zip::file:///a.zip", "a\x00b.png"]
    parquet_with_image_feature(data / "d.parquet", paths)
    dataset = open_dataset("d.parquet", data_dirs=[data])
    samples = [dataset.sample(i) for i in range(len(paths))]
    assert samples[0].error is None and list(samples[0].images[0].getdata())[0] == (200, 30, 30)
    assert samples[1].error.startswith("image '/") and samples[1].error.endswith("' is outside the dataset's folder")
    for sample, path in zip(samples[2:7], paths[2:7]):
        assert sample.error == f"image {path!r} is a URL: only picture files of the dataset are read"
    assert samples[7].error == "image path 'a\\x00b.png' holds a NUL byte"
    assert all(s.images == [] for s in samples[1:]) and asked == []
    # a list of pictures per row (a nested feature) is read undecoded too
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(data / "d.parquet")
    features = datasets.Features({"images": datasets.List(datasets.Image()), "prompt": datasets.Value("string")})
    pictures = table["image"].to_pylist()
    lists = pa.array([pictures[:1], pictures[:3]], features.arrow_schema.field("images").type)
    pq.write_table(pa.table({"images": lists, "prompt": ["one", "three"]}).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features.to_dict()}})}), data / "lists.parquet")
    listed = open_dataset("lists.parquet", data_dirs=[data])
    assert listed.sample(0).error is None and len(listed.sample(0).images) == 1
    assert "is outside the dataset's folder" in listed.sample(1).error and asked == []


def test_table_files_leave_nothing_in_the_datasets_cache(tmp_path, monkeypatch):
    """Every load wrote an Arrow copy into ``~/.cache/huggingface/datasets``, never deleted (+201 MB
    for 10 uploads of 56 KB, other visitors' rows kept). The copy now goes to a temporary folder
    that is gone when ``open_dataset`` returns; the rows stay readable."""
    import tempfile

    import datasets

    shared_cache, temporary = tmp_path / "hf-datasets-cache", tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", shared_cache)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    caches = []
    real_load = datasets.load_dataset

    def load_and_look(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        caches.append(sorted(p for p in Path(kwargs.get("cache_dir") or shared_cache).rglob("*.arrow")))
        return loaded

    monkeypatch.setattr(datasets, "load_dataset", load_and_look)
    data = tmp_path / "upload"
    picture(data / "p.png")
    write_jsonl(data / "d.jsonl", [{"image": "p.png", "prompt": "jsonl?"}])
    (data / "d.csv").write_text("image,prompt\np.png,csv?\n")
    datasets.Dataset.from_list([{"image": "p.png", "prompt": "parquet?"}]).to_parquet(str(data / "d.parquet"))
    save_rows(data / "saved", ["saved?"])
    for name in ("d.jsonl", "d.csv", "d.parquet", "saved"):
        sample = open_dataset(str(data / name)).sample(0)
        assert sample.error is None and sample.prompt == name.removeprefix("d.") + "?", name
    assert len(caches) == 3 and all(found and all(p.is_relative_to(temporary) for p in found) for found in caches)
    assert not shared_cache.exists() or not any(shared_cache.rglob("*"))
    assert list(temporary.iterdir()) == []


def test_a_zipped_saved_dataset_naming_another_ones_file_is_refused(tmp_path):
    """The app's path: the tampered saved dataset arrives as a zip, is unpacked into the uploads
    folder and opened confined to it; the other dataset on the server stays unread."""
    import zipfile

    from g4v.evaluate.uploads import extract_upload

    save_rows(tmp_path / "server" / "theirs", ["someone else's row"])
    mine = save_rows(tmp_path / "made" / "mine", ["my row"])
    state = json.loads((mine / "state.json").read_text())
    state["_data_files"] = [{"filename": f"../../../theirs/{ARROW}"}]  # from uploads/NAME/mine to server/theirs
    (mine / "state.json").write_text(json.dumps(state))
    with zipfile.ZipFile(tmp_path / "upload.zip", "w") as zipped:
        for path in sorted(mine.iterdir()):
            zipped.write(path, f"mine/{path.name}")
    uploads = tmp_path / "server" / "uploads"
    (uploads / "one").mkdir(parents=True)
    source = extract_upload([tmp_path / "upload.zip"], uploads / "one")
    assert source == uploads / "one" / "mine"
    assert (source / f"../../../theirs/{ARROW}").resolve().is_file()  # the escape would have found it
    message = refused(source, data_dirs=[uploads])
    assert message.endswith("names a file outside its folder: only its own files are read") and str(tmp_path) not in message
