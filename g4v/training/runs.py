"""Training runs to read: the run folders, and what a run's files say about its 8 levels.

* **Only configured folders.** Runs are looked up in the run folders (``--runs-dir``, else
  ``$G4V_RUNS_DIR``, else ``assets``, where the trained demo checkpoint keeps its training log). A
  typed name or path is resolved (symlinks, ``..``) and refused unless it lies inside one of them,
  as adapters and datasets are.
* **What a run folder holds**, read in this order: the demo trainer's ``training_log.jsonl``
  (:mod:`g4v.training.log_file`), a ``transformers.Trainer``'s ``trainer_state.json`` (its own, or
  its newest checkpoint's), TensorBoard event files (read with TensorBoard's own reader). A run
  without Deepstack metrics but with checkpoints (``checkpoint-N`` folders) is measured instead
  (:mod:`g4v.training.measure`).

Every problem with a folder is one line (:class:`G4VError`) that names the run as it was typed.
"""

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from g4v.errors import G4VError, quoted
from g4v.paths import ASSETS_DIR, REPO_ROOT
from g4v.training.log_file import FORMAT, LOG_FILE
from g4v.training.records import PREFIX, Alert, Record, level_names_in

RUNS_ENV = "G4V_RUNS_DIR"
DEFAULT_RUNS_DIR = ASSETS_DIR
STATE_FILE = "trainer_state.json"
EVENTS = re.compile(r"events\.out\.tfevents\..+")
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
#: How deep below a run folder event files are looked for (the Trainer writes ``runs/<date>/``),
#: and below a run-folder root runs are listed: a bounded walk, whatever a root holds.
EVENTS_DEPTH, LIST_DEPTH = 3, 3
#: The largest log file read (a year of logging every step stays far below it).
MAX_FILE_BYTES = 200 * 2**20


def runs_dirs(configured: str | Path | list | None = None) -> list[Path]:
    """The run folders: ``configured`` (a folder, a list, or ``os.pathsep``-joined folders), else
    ``$G4V_RUNS_DIR``, else ``assets``."""
    if configured is None or configured == "" or configured == []:
        configured = os.environ.get(RUNS_ENV) or str(DEFAULT_RUNS_DIR)
    if isinstance(configured, (str, Path)):
        configured = [part for part in str(configured).split(os.pathsep) if part]
    return [Path(folder).expanduser() for folder in configured]


def folder_label(folder: Path) -> str:
    """A run folder as messages name it: relative to the project (``assets``), else by its own name
    only, so that a web page never shows where the server keeps its files."""
    resolved = Path(folder).expanduser().resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else resolved.name


def is_run(folder: Path) -> bool:
    """Whether ``folder`` holds a training log, a trainer state, event files or checkpoints."""
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return False
    return any(name in (LOG_FILE, STATE_FILE) or EVENTS.fullmatch(name) or CHECKPOINT.fullmatch(name)
               for name in names) or any(_events_in(folder / "runs"))


def list_runs(dirs: list[Path] | None = None) -> list[str]:
    """The runs in the run folders, by the name a user types (relative to their root), sorted."""
    names = set()
    for root in dirs if dirs is not None else runs_dirs():
        if root.is_dir():
            for folder in _walk(root, LIST_DEPTH):
                if is_run(folder) and not CHECKPOINT.fullmatch(folder.name):
                    names.add(folder.relative_to(root).as_posix() if folder != root else ".")
    return sorted(names)


def resolve_run(choice: str, dirs: list[Path] | None = None) -> tuple[str, Path]:
    """A typed run name or path -> ``(name, resolved folder)``, inside a run folder or refused."""
    dirs = dirs if dirs is not None else runs_dirs()
    roots = [root.resolve() for root in dirs]
    text = (choice or "").strip()
    if not text:
        raise G4VError("choose a training run")
    if "\x00" in text or len(text) > 4096:
        raise G4VError(f"run name {quoted(text)} is not a folder name")
    typed = Path(text).expanduser()
    candidates = [typed] if typed.is_absolute() else [root / typed for root in roots] + [typed]
    inside = [(real, root) for real in (c.resolve() for c in candidates)
              for root in roots if real == root or root in real.parents]
    for real, root in inside:
        if real.is_dir():
            return (real.relative_to(root).as_posix() or "."), real
    if inside:
        raise G4VError(f"run folder not found: {quoted(text, 80)}")
    folders = ", ".join(folder_label(d) for d in dirs)
    raise G4VError(f"run folder {quoted(text, 80)} is outside the run folders ({folders}); "
                   f"name its folder with --runs-dir or ${RUNS_ENV}")


@dataclass
class RunCurves:
    """What a run says about its 8 levels: one :class:`Record` per measured step."""

    name: str
    source: str  # where the numbers came from, in words
    levels: list[str]
    records: list[Record]
    loss: dict[int, float] = field(default_factory=dict)  # step -> training loss, where logged
    checkpoints: dict[int, Path] = field(default_factory=dict)  # step -> checkpoint folder

    @property
    def alerts(self) -> list[Alert]:
        return [alert for record in self.records for alert in record.alerts]

    def to_dict(self) -> dict:
        return {"run": self.name, "source": self.source, "levels": self.levels,
                "records": [record.to_dict() for record in self.records],
                "loss": {str(step): value for step, value in sorted(self.loss.items())},
                "alerts": [alert.to_dict() for alert in self.alerts],
                "checkpoints": sorted(self.checkpoints)}


def checkpoints_of(folder: Path, root: Path | None = None) -> dict[int, Path]:
    """``checkpoint-N`` folders holding a model or an adapter, by step (links leading out refused);
    the run folder itself counts as its last step's checkpoint when it holds a model (a demo run)."""
    found = {}
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = CHECKPOINT.fullmatch(entry.name)
        if match and entry.is_dir() and _inside(entry, root or folder) and (
                (entry / "config.json").is_file() or (entry / "adapter_config.json").is_file()):
            found[int(match.group(1))] = entry.resolve()
    return found


def read_run(folder: Path, name: str) -> RunCurves:
    """The run's records from its first source that holds Deepstack metrics (module docstring)."""
    log = folder / LOG_FILE
    checkpoints = checkpoints_of(folder)
    sources = []
    if log.is_file():
        header, entries = _read_log(log, name)
        curves = _from_entries(name, "the trainer's training log", entries, header.get("levels"))
        if (folder / "config.json").is_file() and curves.records:  # the log of the checkpoint beside it
            checkpoints.setdefault(curves.records[-1].step, folder.resolve())
        return _with(curves, checkpoints)
    state = _state_file(folder, checkpoints)
    if state is not None:
        entries = _read_json(state, name).get("log_history")
        if not isinstance(entries, list):
            raise G4VError(f"run {quoted(name)}: {_shown(state, folder)} holds no log_history list")
        curves = _from_entries(name, f"the Trainer's {STATE_FILE}", entries)
        if curves.records:
            return _with(curves, checkpoints)
        sources.append(STATE_FILE)
    events = list(_events_in(folder))
    if events:
        curves = _from_events(name, events)
        if curves.records:
            return _with(curves, checkpoints)
        sources.append("TensorBoard events")
    if checkpoints:
        return RunCurves(name, "checkpoints (to measure)", [], [], {}, checkpoints)
    if sources:
        raise G4VError(f"run {quoted(name)}: its {' and '.join(sources)} hold no Deepstack metrics "
                       f"({PREFIX}/<level>/...) and it keeps no checkpoints to measure: another model's run, or "
                       "one trained without the g4v training monitor")
    raise G4VError(f"run {quoted(name)} holds no training log, {STATE_FILE}, TensorBoard events or checkpoints")


def _with(curves: RunCurves, checkpoints: dict[int, Path]) -> RunCurves:
    curves.checkpoints = checkpoints
    return curves


def _state_file(folder: Path, checkpoints: dict[int, Path]) -> Path | None:
    if (folder / STATE_FILE).is_file():
        return folder / STATE_FILE
    newest = [checkpoints[step] / STATE_FILE for step in sorted(checkpoints, reverse=True)]
    return next((path for path in newest if path.is_file()), None)


def _from_entries(name: str, source: str, entries: list, levels: list[str] | None = None) -> RunCurves:
    """Records from ``log_history``-style entries (``{"step": N, name: value}``), merged by step."""
    by_step: dict[int, dict] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("step"), int) and not isinstance(entry["step"], bool):
            by_step.setdefault(entry["step"], {}).update(entry)
    return _curves(name, source, by_step, levels)


def _curves(name: str, source: str, by_step: dict[int, dict], levels: list[str] | None) -> RunCurves:
    levels = levels or level_names_in(key for values in by_step.values() for key in values)
    records = [record for step in sorted(by_step)
               if (record := Record.from_logs(step, by_step[step], levels)) is not None]
    loss = {step: float(values["loss"]) for step, values in sorted(by_step.items())
            if isinstance(values.get("loss"), (int, float)) and not isinstance(values.get("loss"), bool)}
    return RunCurves(name, source, levels, records, loss)


def _from_events(name: str, files: list[Path]) -> RunCurves:
    """Scalars of TensorBoard event files, read with TensorBoard's own reader, merged by step."""
    from tensorboard.backend.event_processing import event_accumulator

    by_step: dict[int, dict] = {}
    for path in files:
        reader = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
        try:
            reader.Reload()
        except Exception as err:  # TensorBoard raises its own error types for a damaged file
            raise G4VError(f"run {quoted(name)}: TensorBoard cannot read {path.name} ({type(err).__name__})") from None
        for tag in reader.Tags().get("scalars", []):
            key = tag.removeprefix("train/")  # the Trainer's TensorBoard callback files loss under train/
            for event in reader.Scalars(tag):
                by_step.setdefault(int(event.step), {})[key] = float(event.value)
    return _curves(name, "TensorBoard events", by_step, None)


def _events_in(folder: Path):
    for path in _walk(folder, EVENTS_DEPTH):
        try:
            entries = sorted(path.iterdir())
        except OSError:
            continue
        for entry in entries:
            if EVENTS.fullmatch(entry.name) and entry.is_file() and _inside(entry, folder):
                yield entry


def _walk(root: Path, depth: int):
    """``root`` and the folders below it, ``depth`` levels at most, hidden ones and links skipped."""
    yield root
    if depth <= 0:
        return
    try:
        children = sorted(entry for entry in root.iterdir() if entry.is_dir() and not entry.is_symlink()
                          and not entry.name.startswith("."))
    except OSError:
        return
    for child in children:
        yield from _walk(child, depth - 1)


def _inside(path: Path, folder: Path) -> bool:
    real, top = path.resolve(), folder.resolve()
    return real == top or top in real.parents


def _shown(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix() if folder in path.parents else path.name


def _read_text(path: Path, name: str) -> str:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise G4VError(f"run {quoted(name)}: {path.name} is larger than {MAX_FILE_BYTES // 2**20} MB")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise G4VError(f"run {quoted(name)}: {path.name} is not UTF-8 text") from None


def _read_json(path: Path, name: str) -> dict:
    try:
        data = json.loads(_read_text(path, name))
    except json.JSONDecodeError as err:
        raise G4VError(f"run {quoted(name)}: {path.name} is not valid JSON (line {err.lineno})") from None
    if not isinstance(data, dict):
        raise G4VError(f"run {quoted(name)}: {path.name} holds no JSON object")
    return data


def _read_log(path: Path, name: str) -> tuple[dict, list[dict]]:
    lines = [line for line in _read_text(path, name).splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise G4VError(f"run {quoted(name)}: {LOG_FILE} line {number} is not valid JSON") from None
    if not rows or not isinstance(rows[0], dict) or rows[0].get("format") != FORMAT:
        raise G4VError(f"run {quoted(name)}: {LOG_FILE} does not start with a {FORMAT} header")
    if rows[0].get("model_type") != "granite4_vision":
        raise G4VError(f"run {quoted(name)}: its training log is of a {quoted(rows[0].get('model_type'))} model, "
                       "not Granite 4 Vision")
    return rows[0], rows[1:]
