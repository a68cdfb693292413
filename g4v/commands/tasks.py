"""``chat --task``: Granite Vision's documented task prompts, and the answer read back as structure.

Kept beside :mod:`g4v.commands.chat` so that command stays a plain chat: it asks this module for the
prompt, and hands it the finished answer to print (``--json``) or to summarise on stderr.
"""

import json
import sys
from pathlib import Path

from g4v.documents.presets import MAX_SCHEMA_CHARS, PRESETS, build_prompt, get_preset, parse_schema
from g4v.errors import G4VError


def add_task_flags(parser) -> None:
    parser.add_argument("--task", default=None, choices=list(PRESETS),
                        help="send a documented Granite Vision task prompt instead of PROMPT "
                             "(qa: PROMPT is the question)")
    parser.add_argument("--schema", default=None, metavar="FILE",
                        help="--task kvp: the JSON schema of the fields to extract")
    parser.add_argument("--json", action="store_true",
                        help="print the answer and its structured reading (table rows, schema problems) as JSON")


def task_prompt(args) -> str:
    """The text to send: PROMPT alone, or the task's documented prompt (checked before the model loads)."""
    if args.task is None:
        if args.schema:
            raise G4VError("--schema needs --task kvp")
        if args.prompt is None or not args.prompt.strip():
            raise G4VError("the prompt is empty (give PROMPT, or a --task)")
        return args.prompt
    preset = get_preset(args.task)
    if args.prompt is not None and not preset.needs_question:
        raise G4VError(f"--task {args.task} writes the prompt itself; leave out PROMPT (only --task qa takes a question)")
    if args.schema and not preset.needs_schema:
        raise G4VError(f"--schema is only for --task kvp, not --task {args.task}")
    if preset.needs_schema and not args.schema:
        raise G4VError("--task kvp needs --schema FILE (a JSON schema of the fields to extract)")
    prompt = build_prompt(args.task, question=args.prompt or "", schema_text=_schema_text(args.schema))
    if not args.image:
        raise G4VError(f"--task {args.task} reads a picture or a page: give --image FILE")
    return prompt


def _schema_text(path: str | None) -> str:
    if not path:
        return ""
    file = Path(path)
    if not file.is_file():
        raise G4VError(f"schema file not found: {file.name}")
    if file.stat().st_size > MAX_SCHEMA_CHARS * 4:
        raise G4VError(f"schema file {file.name} is too large (the limit is {MAX_SCHEMA_CHARS:,} characters)")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise G4VError(f"schema file {file.name} is not UTF-8 text") from None


def report(args, prompt: str, answer: str) -> None:
    """After the answer: with ``--json`` print everything as one JSON object on stdout; with a task,
    one line on stderr saying whether the answer read as the task's format."""
    structured = None
    if args.task is not None:
        from g4v.documents.structured import read_answer  # only here: a plain chat needs no renderers

        preset = get_preset(args.task)
        schema = parse_schema(_schema_text(args.schema)) if preset.needs_schema else None
        structured = read_answer(preset.output, answer, schema)
    if args.json:
        print(json.dumps({"task": args.task, "prompt": prompt, "answer": answer,
                          "structured": structured.to_dict() if structured else None}, indent=2, ensure_ascii=False))
    elif structured is not None:
        print(summary(structured), file=sys.stderr)


def summary(structured) -> str:
    """One line about a structured answer: its table size, its schema problems or its parse error."""
    if structured.error:
        return f"{structured.kind}: could not read the answer ({structured.error})"
    if structured.problems:
        return f"{structured.kind}: {len(structured.problems)} schema problem(s): " + "; ".join(
            problem.line() for problem in structured.problems[:5])
    if structured.rows:
        return f"{structured.kind}: a table of {len(structured.rows)} rows x {len(structured.rows[0])} columns"
    return f"{structured.kind}: read"
