"""How each kind of dataset becomes a ``datasets.Dataset``, without reading anything it should not.

:mod:`g4v.evaluate.data` decides which reader a source needs; each reader returns the table with
its decodable features undecoded (:func:`_undecoded`: ``datasets`` never opens a picture path or URL
itself, the row does, confined) or raises one line (:class:`G4VError`, no server path):

* :func:`read_file`: one ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file. ``datasets`` writes
  an Arrow copy of every table it reads into its cache; that copy goes into a temporary folder
  deleted as soon as the table is in memory, so an upload leaves nothing in
  ``~/.cache/huggingface`` (where every visitor's data would stay, without bound);
* :func:`read_saved`: a ``save_to_disk`` folder, whose own files are checked before ``datasets``
  opens them (:func:`_saved_split`);
* :func:`read_hub`: a Hub dataset id (the CLI only; the Hub's own cache is the user's).
"""

import codecs
import dataclasses
import json
import os
import tempfile
from pathlib import Path, PurePosixPath

from g4v.errors import G4VError, first_line, quoted

#: File types read as a table, and the ``datasets`` builder that reads each.
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def read_file(path: Path, source: str):
    """One table file through ``datasets``; a broken JSON line is named by its number first
    (``datasets`` itself reports the failing chunk, not the line). The Arrow copy ``datasets``
    makes goes to a temporary cache deleted on return (the table is kept in memory), never to the
    shared ``~/.cache/huggingface``, where every upload would stay."""
    import datasets

    if path.stat().st_size == 0 or (path.suffix.lower() == ".jsonl" and _count_json_lines(path) == 0):
        raise G4VError(f"dataset {path.name} has no rows")
    builder = FILE_BUILDERS.get(path.suffix.lower(), "json")
    if path.suffix.lower() in (".csv", ".json"):  # a .jsonl file was decoded line by line above
        _check_utf8(path)
    datasets.disable_progress_bars()  # a one-file table loads in a moment; the run has its own bar
    # A CSV's cells are read as written: every column text, no "NA"/"None"/"null" turned into a
    # missing value (an empty cell still is one, see ``data._text``).
    options = {"features": _csv_as_text(path), "keep_default_na": False} if builder == "csv" else {}
    with tempfile.TemporaryDirectory(prefix="g4v-datasets-") as cache:
        try:
            table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache,
                                          keep_in_memory=True, **options)
        except Exception as err:  # noqa: BLE001: datasets raises many types; the user gets one line
            raise G4VError(f"cannot read {path.name} as a dataset: {_clean(err)}") from None
    return _undecoded(table)


def _check_utf8(path: Path) -> None:
    """Refuse a text table that is not UTF-8 (``datasets`` says only that generation failed)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise G4VError(f"{path.name} is not UTF-8 text") from None


def _csv_as_text(path: Path):
    """Every column of a CSV file read as text (``datasets.Features``), or None when pandas cannot
    read its header (``datasets`` then reports the problem). Without this, pandas reads a column of
    numbers with an empty cell as floats, and a reference ``3`` would become ``3.0``. The names come
    from pandas itself, so they match what the loader builds (a byte-order mark dropped, an
    unnamed column called ``Unnamed: N``)."""
    import datasets
    import pandas

    try:
        header = list(pandas.read_csv(path, nrows=0, encoding="utf-8-sig").columns)
    except Exception:  # noqa: BLE001 - any unreadable header: let datasets name the problem
        return None
    return datasets.Features({str(name): datasets.Value("string") for name in header})


def _count_json_lines(path: Path) -> int:
    """Rows of a JSON-lines file, each checked to be a JSON object (line numbers in the errors)."""
    rows = 0
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    rows += 1
                    try:
                        value = json.loads(line)
                    except json.JSONDecodeError:
                        raise G4VError(f"line {number} of {path.name} is not valid JSON") from None
                    except RecursionError:
                        raise G4VError(f"line {number} of {path.name} is nested too deeply") from None
                    if not isinstance(value, dict):
                        raise G4VError(f"line {number} of {path.name} is not a JSON object")
    except UnicodeDecodeError:
        raise G4VError(f"{path.name} is not UTF-8 text") from None
    return rows


def read_saved(path: Path, source: str):
    """A ``save_to_disk`` folder; for a DatasetDict the ``test`` split, else the first. Its files
    are checked first (:func:`_saved_split`); the format it was saved with is dropped (rows are
    plain dicts)."""
    import datasets

    folder = _saved_split(path, source)
    try:
        loaded = datasets.Dataset.load_from_disk(str(folder))
    except Exception as err:  # noqa: BLE001
        raise G4VError(f"cannot read the saved dataset {quoted(source, 80)}: {_clean(err)}") from None
    return _undecoded(loaded.with_format(None))


def _saved_split(path: Path, source: str) -> Path:
    """The folder of the split to load, once every file ``load_from_disk`` would open there is
    known to be a plain file of it. ``load_from_disk`` joins ``state.json``'s data file names (and
    ``dataset_dict.json``'s split names) onto the folder as they are, so an absolute path, a ``..``
    or a link would load any Arrow file on the server (and tell a non-Arrow one's size and path)."""
    if (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
        splits = _saved_json(path, "dataset_dict.json", source).get("splits")
        if not isinstance(splits, list) or not splits or not all(isinstance(name, str) for name in splits):
            raise G4VError(f"the saved dataset {quoted(source, 80)} is damaged: dataset_dict.json lists no splits")
        path = _own_path(path, "test" if "test" in splits else splits[0], source, "split")
    _own_path(path, "dataset_info.json", source, "file")
    files = _saved_json(path, "state.json", source).get("_data_files")
    if not isinstance(files, list) or not files or not all(isinstance(f, dict) and isinstance(f.get("filename"), str)
                                                           for f in files):
        raise G4VError(f"the saved dataset {quoted(source, 80)} is damaged: state.json lists no data files")
    for entry in files:
        _own_path(path, entry["filename"], source, "data file")
    return path


def _saved_json(folder: Path, name: str, source: str) -> dict:
    """One of a saved dataset's JSON files, as an object."""
    try:
        value = json.loads(_own_path(folder, name, source, "file").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or not UTF-8
        value = None
    if not isinstance(value, dict):
        raise G4VError(f"the saved dataset {quoted(source, 80)} is damaged: {name} is not a JSON object")
    return value


def _own_path(folder: Path, name: str, source: str, what: str) -> Path:
    """``folder / name`` when it is a plain file (or, for a split, folder) of ``folder`` itself:
    not absolute, no ``..``, not a link, not outside once resolved."""
    relative = PurePosixPath(name)
    shown = f"{quoted(source, 80)} ({what} {quoted(relative.name, 60)})"
    path = folder.joinpath(*relative.parts)
    if not name or "\x00" in name or "\\" in name or relative.is_absolute() or ".." in relative.parts \
            or not path.resolve().is_relative_to(folder.resolve()):
        raise G4VError(f"the saved dataset {shown} names a file outside its folder: only its own files are read")
    if path.is_symlink():
        raise G4VError(f"the saved dataset {shown} names a link: only its own files are read")
    if not (path.is_dir() if what == "split" else path.is_file()):
        raise G4VError(f"the saved dataset {shown} is damaged: that {what} is missing")
    return path


def read_hub(source: str):
    import datasets
    from huggingface_hub.utils import logging as hub_logging

    # offline, the Hub client logs every retry ("Retrying in 8s", the URL) on stderr: the user
    # gets the one line below instead
    levels = datasets.logging.get_verbosity(), hub_logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    hub_logging.set_verbosity_error()
    try:
        loaded = datasets.load_dataset(source, split="test")
    except Exception as err:  # noqa: BLE001
        raise G4VError(f"cannot load {quoted(source, 80)} from the Hugging Face Hub "
                       f"(offline, or no such dataset or test split): {_clean(err)}") from None
    finally:
        datasets.logging.set_verbosity(levels[0])
        hub_logging.set_verbosity(levels[1])
    return _undecoded(loaded)


def _undecoded(table):
    """``table`` with every feature that decodes from a file (``Image``, also ``Audio``, ``Video``,
    ``Pdf``..., nested in lists or dicts too) read as its stored ``{"bytes", "path"}``. Decoding,
    ``datasets`` would open a ``path`` itself, any fsspec URL included (``hf://`` with the server's
    token, ``http://``, another file on the server), before :meth:`EvalDataset._picture_path` could
    refuse it; undecoded, a broken picture is also one row's error, not the whole run's."""
    import datasets

    for name, feature in table.features.items():
        plain = _without_decoding(feature)
        if plain == feature:
            continue
        if hasattr(plain, "decode_example"):  # a column of its own: only the schema changes
            table = table.cast_column(name, plain)
        else:  # nested: a copy in memory (never a cache file beside a saved dataset)
            table = table.cast(datasets.Features({**table.features, name: plain}), keep_in_memory=True)
    return table


def _without_decoding(feature):
    import datasets

    if isinstance(feature, dict):
        return {key: _without_decoding(value) for key, value in feature.items()}
    if isinstance(feature, list):
        return [_without_decoding(feature[0])]
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        return dataclasses.replace(feature, feature=_without_decoding(feature.feature))
    if getattr(feature, "decode", False) and not isinstance(feature, datasets.Json):  # Json decodes a cell's text
        return dataclasses.replace(feature, decode=False)
    return feature


def _clean(err: BaseException) -> str:
    """The library's message without server paths: each path-like word reduced to its file name."""
    words = first_line(err, 200).split()
    return " ".join(Path(w.strip("'\",")).name if os.sep in w else w for w in words)
