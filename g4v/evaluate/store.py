"""A run's folder: what is written, when, and how an interrupted run is picked up again.

* ``run.json``: the run's settings, written first. A later run in the same folder must ask the
  same question (speed, the number of rows and the arms' labels aside: :data:`MAY_CHANGE`), or it
  is refused.
* ``samples.jsonl``: one finished row per line, appended and flushed to disk as each chunk ends,
  so a killed run loses at most the chunk in flight. A kill can tear the last line; reading drops
  it (and cuts it off the file), so the row is simply computed again.
* ``samples.parquet``, ``samples.csv``, ``summary.json``: written from ``samples.jsonl`` at the end.
  In ``samples.csv`` a text cell a spreadsheet would run as a formula starts with ``'``
  (:func:`csv_cell`); the Parquet and JSON files keep the exact text.

A folder someone changed is refused in one line before any model loads: a file that is a link or
not a plain file (writing through a link would truncate or overwrite what it points to; every
file is also opened with ``O_NOFOLLOW``), a damaged ``run.json``, a row of the wrong shape or types.
"""

import csv
import errno
import json
import math
import os
import stat
import typing
from dataclasses import asdict, fields
from pathlib import Path

from g4v.errors import G4VError, quoted

RUN_FILE = "run.json"
ROWS_FILE = "samples.jsonl"
PARQUET_FILE = "samples.parquet"
CSV_FILE = "samples.csv"
SUMMARY_FILE = "summary.json"
RUN_FILES = (RUN_FILE, ROWS_FILE, PARQUET_FILE, CSV_FILE, SUMMARY_FILE)
#: First characters that make a spreadsheet read a cell as a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: Settings a resumed run may change: how fast it goes (``concurrency``, ``batch_size``: greedy
#: answers are the same batched or not) and how many rows it covers (``limit``: the rows are the
#: first N of one fixed order, so a larger limit only adds rows). An arm's ``label`` is only its
#: shown name. ``margin`` and ``discordance`` only change how the rows are summed up.
MAY_CHANGE = ("concurrency", "batch_size", "limit", "margin", "discordance")


def _question(settings: dict) -> dict:
    """What a run's answers depend on: its settings without those in :data:`MAY_CHANGE` and
    without the arms' labels."""
    kept = {key: value for key, value in settings.items() if key not in MAY_CHANGE}
    for arm in ("a", "b"):
        if isinstance(kept.get(arm), dict):
            # an arm recorded before it had a setting (a vision LoRA mode, a dtype, a quantization, a
            # token budget; None when not set) is the same arm as one with that setting unset
            kept[arm] = {key: value for key, value in kept[arm].items() if key != "label" and value is not None}
    return kept


def prepare(out_dir: Path, settings: dict) -> None:
    """Create ``out_dir`` and record ``settings``; refuse a folder holding a different run, or
    results without a ``run.json`` (someone else's files: they would be overwritten)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise G4VError(f"the output folder {quoted(out_dir.name or str(out_dir), 80)} is a file; "
                       "name a folder with --out") from None
    except OSError as err:
        raise G4VError(f"cannot create the output folder {quoted(out_dir.name or str(out_dir), 80)} "
                       f"({err.strerror or type(err).__name__})") from None
    for path in (out_dir / name for name in RUN_FILES):  # found now, before any model loads
        if path.is_symlink() or (path.exists() and not path.is_file()):
            kind = "a link" if path.is_symlink() else "not a file"
            raise G4VError(f"{path.name} in the output folder is {kind}; use a new --out folder")
    recorded = out_dir / RUN_FILE
    if recorded.is_file():
        previous = _settings(recorded, f"{RUN_FILE} in the output folder is damaged; use a new --out folder")
        previous, asked = _question(previous), _question(settings)
        changed = sorted(key for key in {**previous, **asked} if previous.get(key) != asked.get(key))
        if changed:
            raise G4VError(f"the output folder holds a different run (it differs in {', '.join(changed)}); "
                           "use a new --out folder, or the same settings to resume it")
    else:
        theirs = [name for name in (ROWS_FILE, PARQUET_FILE, CSV_FILE, SUMMARY_FILE) if (out_dir / name).exists()]
        if theirs:
            raise G4VError(f"the output folder has {theirs[0]} but no {RUN_FILE}; use a new --out folder")
    with _open(recorded, "w") as handle:
        handle.write(json.dumps(settings, indent=1) + "\n")


def shareable(settings: dict, dataset: str) -> dict:
    """``run.json``'s settings for an export that leaves the server: the dataset by ``dataset`` (its
    name) and each arm's model by its folder name or hub id, never a server path."""
    from g4v.loading import model_name

    arms = {side: {**settings[side], "model": model_name(settings[side].get("model")) or None}
            for side in ("a", "b") if isinstance(settings.get(side), dict)}
    return {**settings, **arms, "data": dataset}


def read_settings(out_dir: Path) -> dict:
    path = Path(out_dir) / RUN_FILE
    if not path.exists() and not path.is_symlink():
        raise G4VError(f"no finished or started run here (no {RUN_FILE})")
    return _settings(path, f"{RUN_FILE} is damaged")


def _settings(path: Path, damaged: str) -> dict:
    """A ``run.json`` as an object, else the one line ``damaged``."""
    try:
        with _open(path, "r") as handle:
            settings = json.load(handle)
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or not UTF-8
        settings = None
    if not isinstance(settings, dict):
        raise G4VError(damaged)
    return settings


def read_rows(out_dir: Path, row_type) -> dict[int, object]:
    """Finished rows by index. Each row is written as one line ending in a newline, so a last
    line without one was torn by a kill: it is cut off the file and its row computed again.
    Damage anywhere else (a line that is not one row of ``row_type``'s fields and types) is
    refused."""
    path = Path(out_dir) / ROWS_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    with _open(path, "rb") as handle:
        data = handle.read()
    if not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with _open(path, "r+b") as handle:
            handle.truncate(len(data))
    types = _field_types(row_type)
    later = _later_fields(row_type)
    rows = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            values = json.loads(line)
        except (ValueError, RecursionError):
            values = None
        if isinstance(values, dict):
            values = {**{name: None for name in later - set(values)}, **values}
        if not isinstance(values, dict) or set(values) != set(types) or not all(
                _has_type(values[name], kind, optional) for name, (kind, optional) in types.items()):
            raise G4VError(f"line {number} of {ROWS_FILE} is damaged; use a new --out folder")
        rows[values["index"]] = row_type(**values)
    return rows


def _later_fields(row_type) -> set[str]:
    """Fields a row written by an earlier version may lack: those whose default is None (a column
    added later, empty where it does not apply), so a run started before it still resumes."""
    return {field.name for field in fields(row_type) if field.default is None}


def _has_type(value, kind: type, optional: bool) -> bool:
    """``value`` (from JSON) is of the field's type: exactly (``True`` is no ``int``), a float
    finite (``NaN`` would stop the summary), None only where the field allows it."""
    if value is None:
        return optional
    if kind is float:
        return type(value) in (float, int) and math.isfinite(value)
    return type(value) is kind


class RowWriter:
    """Appends rows to ``samples.jsonl``, each batch flushed and synced before returning."""

    def __init__(self, out_dir: Path):
        self._handle = _open(Path(out_dir) / ROWS_FILE, "a")

    def write(self, rows: list) -> None:
        for row in rows:
            self._handle.write(json.dumps(asdict(row), allow_nan=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def write_tables(out_dir: Path, rows: list, row_type, summary: dict) -> None:
    """``samples.parquet``, ``samples.csv`` (one column per field, rows in run order) and
    ``summary.json`` (``summary``: the run summary's plain form, ``RunSummary.to_dict()``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    names = [f.name for f in fields(row_type)]
    records = [asdict(row) for row in rows]
    with _open(out_dir / PARQUET_FILE, "wb") as handle:
        pq.write_table(pa.Table.from_pylist(records, schema=_schema(row_type)), handle)
    with _open(out_dir / CSV_FILE, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows({name: csv_cell(value) for name, value in record.items()} for record in records)
    with _open(out_dir / SUMMARY_FILE, "w") as handle:
        handle.write(json.dumps(summary, indent=1, allow_nan=False) + "\n")


def csv_cell(value):
    """A text cell that a spreadsheet would run as a formula (it starts with one of
    :data:`FORMULA_STARTS`: a prompt, an answer, an id can) with a ``'`` before it, OWASP's rule
    against CSV injection; numbers and other text are written as they are."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def read_summary(out_dir: Path) -> dict | None:
    """``summary.json``, or None when it is missing or damaged (the caller sums the rows up again)."""
    path = Path(out_dir) / SUMMARY_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        with _open(path, "r") as handle:
            summary = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None
    return summary if isinstance(summary, dict) else None


def _open(path: Path, mode: str):
    """A run file opened only if it is a plain file, never through a link (``O_NOFOLLOW``): one
    line otherwise. ``mode`` as for :func:`open` (``r``, ``w``, ``a``, ``r+``, each with ``b``)."""
    flags = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "r+": os.O_RDWR}[mode.replace("b", "")]
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)  # NONBLOCK: a FIFO does not hang
    except OSError as err:
        problem = {errno.ELOOP: "is a link", errno.EISDIR: "is a folder"}.get(
            err.errno, f"cannot be opened ({err.strerror})")
        raise G4VError(f"{path.name} in the output folder {problem}; use a new --out folder") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise G4VError(f"{path.name} in the output folder is not a file; use a new --out folder")
    return os.fdopen(descriptor, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""}))


def _field_types(row_type) -> dict[str, tuple[type, bool]]:
    """Each field's type from the row's annotations (``int``, ``str | None``...), and whether it may be None."""
    types = {}
    for name, hint in typing.get_type_hints(row_type).items():
        allowed = typing.get_args(hint) or (hint,)
        types[name] = next(arg for arg in allowed if arg is not type(None)), type(None) in allowed
    return types


def _schema(row_type):
    """A fixed Parquet schema from the row's annotations, so a column that is empty in this run
    still has its type."""
    import pyarrow as pa

    kinds = {int: pa.int64(), str: pa.string(), bool: pa.bool_(), float: pa.float64()}
    return pa.schema([pa.field(name, kinds[kind]) for name, (kind, _) in _field_types(row_type).items()])
