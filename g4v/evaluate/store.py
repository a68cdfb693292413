"""A run's folder: what is written, when, and how an interrupted run is picked up again.

* ``run.json``: the run's settings, written first. A later run in the same folder must ask the
  same question (speed, the number of rows and the arms' labels aside: :data:`MAY_CHANGE`), or it
  is refused.
* ``samples.jsonl``: one finished row per line, appended and flushed to disk as each chunk ends,
  so a killed run loses at most the chunk in flight. A kill can tear the last line; reading drops
  it (and cuts it off the file), so the row is simply computed again.
* ``samples.parquet``, ``samples.csv``, ``summary.json``: written from ``samples.jsonl`` at the end.
"""

import csv
import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from g4v.errors import G4VError, quoted

RUN_FILE = "run.json"
ROWS_FILE = "samples.jsonl"
PARQUET_FILE = "samples.parquet"
CSV_FILE = "samples.csv"
SUMMARY_FILE = "summary.json"
#: Settings a resumed run may change: how fast it goes (``concurrency``) and how many rows it covers
#: (``limit``: the rows are the first N of one fixed order, so a larger limit only adds rows). An
#: arm's ``label`` is only its shown name.
MAY_CHANGE = ("concurrency", "limit")


def _question(settings: dict) -> dict:
    """What a run's answers depend on: its settings without those in :data:`MAY_CHANGE` and
    without the arms' labels."""
    kept = {key: value for key, value in settings.items() if key not in MAY_CHANGE}
    for arm in ("a", "b"):
        if isinstance(kept.get(arm), dict):
            kept[arm] = {key: value for key, value in kept[arm].items() if key != "label"}
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
    recorded = out_dir / RUN_FILE
    if recorded.is_file():
        try:
            previous = json.loads(recorded.read_text())
        except (OSError, json.JSONDecodeError):
            raise G4VError(f"{RUN_FILE} in the output folder is damaged; use a new --out folder") from None
        previous, asked = _question(previous), _question(settings)
        changed = sorted(key for key in {**previous, **asked} if previous.get(key) != asked.get(key))
        if changed:
            raise G4VError(f"the output folder holds a different run (it differs in {', '.join(changed)}); "
                           "use a new --out folder, or the same settings to resume it")
    else:
        theirs = [name for name in (ROWS_FILE, PARQUET_FILE, CSV_FILE, SUMMARY_FILE) if (out_dir / name).exists()]
        if theirs:
            raise G4VError(f"the output folder has {theirs[0]} but no {RUN_FILE}; use a new --out folder")
    recorded.write_text(json.dumps(settings, indent=1) + "\n")


def shareable(settings: dict, dataset: str) -> dict:
    """``run.json``'s settings for an export that leaves the server: the dataset by ``dataset`` (its
    name) and each arm's model by its folder name or hub id, never a server path."""
    from g4v.loading import model_name

    arms = {side: {**settings[side], "model": model_name(settings[side].get("model")) or None}
            for side in ("a", "b") if isinstance(settings.get(side), dict)}
    return {**settings, **arms, "data": dataset}


def read_settings(out_dir: Path) -> dict:
    try:
        return json.loads((Path(out_dir) / RUN_FILE).read_text())
    except FileNotFoundError:
        raise G4VError(f"no finished or started run here (no {RUN_FILE})") from None
    except (OSError, json.JSONDecodeError):
        raise G4VError(f"{RUN_FILE} is damaged") from None


def read_rows(out_dir: Path, row_type) -> dict[int, object]:
    """Finished rows by index. Each row is written as one line ending in a newline, so a last
    line without one was torn by a kill: it is cut off the file and its row computed again.
    Damage anywhere else is refused."""
    path = Path(out_dir) / ROWS_FILE
    if not path.is_file():
        return {}
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "r+b") as handle:
            handle.truncate(len(data))
    names = {f.name for f in fields(row_type)}
    rows = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            values = json.loads(line)
            if not isinstance(values, dict) or set(values) != names:
                raise ValueError
        except ValueError:
            raise G4VError(f"line {number} of {ROWS_FILE} is damaged; use a new --out folder") from None
        rows[values["index"]] = row_type(**values)
    return rows


class RowWriter:
    """Appends rows to ``samples.jsonl``, each batch flushed and synced before returning."""

    def __init__(self, out_dir: Path):
        self._handle = open(Path(out_dir) / ROWS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, rows: list) -> None:
        for row in rows:
            self._handle.write(json.dumps(asdict(row), allow_nan=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


def write_tables(out_dir: Path, rows: list, row_type, summary: dict) -> None:
    """``samples.parquet``, ``samples.csv`` (one column per field, rows in run order) and
    ``summary.json``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    names = [f.name for f in fields(row_type)]
    records = [asdict(row) for row in rows]
    pq.write_table(pa.Table.from_pylist(records, schema=_schema(row_type)), out_dir / PARQUET_FILE)
    with open(out_dir / CSV_FILE, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        writer.writerows(records)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")


def read_summary(out_dir: Path) -> dict | None:
    path = Path(out_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _schema(row_type):
    """A fixed Parquet schema from the row's annotations (``int``, ``str | None``...), so a column
    that is empty in this run still has its type."""
    import typing

    import pyarrow as pa

    kinds = {int: pa.int64(), str: pa.string(), bool: pa.bool_(), float: pa.float64()}
    columns = []
    for name, hint in typing.get_type_hints(row_type).items():
        base = next(arg for arg in (typing.get_args(hint) or (hint,)) if arg is not type(None))
        columns.append(pa.field(name, kinds[base]))
    return pa.schema(columns)
