"""Granite Vision's document tasks as presets: the exact prompt each one sends, and what it returns.

Granite Vision 4.x documents its extraction tasks as *task tags*: the user message is the tag alone
(``<chart2csv>``, ``<tables_html>``, ...), and the model's own chat template expands the tag into the
full instruction it was trained with. So the documented prompt is the tag itself; sending our own
paraphrase of the expanded instruction would be a different prompt. (The bundled tiny checkpoints'
chat template has no expansion: there the tag reaches the model as written.)

Sources, read 2026-11 (each preset names its own):

* ``CARD_40``: https://huggingface.co/ibm-granite/granite-4.0-3b-vision, model card, section
  "Supported Tasks" (table of tags: tag, task, output).
* ``CARD_41``: https://huggingface.co/ibm-granite/granite-vision-4.1-4b, model card, section
  "Supported Tasks" (the same six tags, same table).
* ``TRANSFORMERS_DOC``: transformers ``docs/source/en/model_doc/granite4_vision.md``, "Usage tips":
  "Pass these as the text prompt along with a document image. For key-value pair extraction, provide
  a JSON schema describing the fields to extract. The model returns structured JSON matching the
  schema."
* ``CARD_33``: https://huggingface.co/ibm-granite/granite-vision-3.3-2b, model card, section
  "Usage with transformers": a plain question about the image, no template of its own.

* ``VAREX``: IBM Research's VAREX benchmark (Barzelay et al. 2026, "VAREX: A Benchmark for
  Multi-Modal Structured Extraction from Documents", arXiv:2603.15118; dataset
  ``ibm-research/VAREX``), README "Run extraction": the system prompt every reported result used.
  Docling's Granite Vision 4.1 extraction (``docling/datamodel/extraction_options.py``,
  ``_build_extraction_prompt``) sends the same instruction in nearly the same words.

Key-value extraction has two presets:

* ``kvp``: OUR OWN wording (:data:`KVP_PROMPT_TEMPLATE`, ``documented=False``), the one the bundled
  documents checkpoint was trained on. Kept as the default because it was measured better *there*:
  on 100 held-out key-value pictures the checkpoint answers 99% valid JSON and 93.8% of fields with
  it, 0% and 0% with VAREX's wording (docs/demo-model.md, "Which key-value prompt").
* ``kvp_varex``: VAREX's documented wording (:data:`VAREX_KVP_PROMPT_TEMPLATE`), the wording the
  real model's key-value score was measured with: the one to use with ``granite-vision-4.1-4b``.
"""

import json
from dataclasses import dataclass

from g4v.errors import G4VError

CARD_40 = "https://huggingface.co/ibm-granite/granite-4.0-3b-vision (model card, 'Supported Tasks')"
CARD_41 = "https://huggingface.co/ibm-granite/granite-vision-4.1-4b (model card, 'Supported Tasks')"
TRANSFORMERS_DOC = "transformers docs/source/en/model_doc/granite4_vision.md ('Usage tips')"
CARD_33 = "https://huggingface.co/ibm-granite/granite-vision-3.3-2b (model card, 'Usage with transformers')"
VAREX = ("IBM Research VAREX benchmark, arXiv:2603.15118 (README 'Run extraction'); the same instruction as "
         "Docling's Granite Vision 4.1 extraction prompt")

#: Our own key-value prompt (NOT documented, see the module docstring); ``{schema}`` is the user's
#: JSON schema on one line (``json.dumps``' default separators): indentation would add hundreds of
#: tokens to every request and tell the model nothing. The demo checkpoint's key-value training (issue 21) uses this text.
KVP_PROMPT_TEMPLATE = ("Extract the values of the fields described by this JSON schema from the document. "
                       "Answer with one JSON object that matches the schema, nothing else.\n{schema}")
#: VAREX's extraction prompt, word for word (see ``VAREX`` above), the schema indented by 2 as there.
#: VAREX sends it as the system message with the picture alone in the user message; here it is the
#: user's text beside the picture, as every preset.
VAREX_KVP_PROMPT_TEMPLATE = ("Extract structured data from this document.\n"
                             "Return a JSON object matching this schema:\n\n{schema}\n\n"
                             "Return null for fields you cannot find.\n"
                             "Return ONLY valid JSON.\n"
                             "Return an instance of the JSON with extracted values, not the schema itself.")
#: The longest schema text accepted (it becomes part of the prompt).
MAX_SCHEMA_CHARS = 20_000


@dataclass(frozen=True)
class Preset:
    """One task: its key (the CLI's ``--task``), the label the app shows, the prompt it sends, the
    kind of answer it expects (which renderer reads it), whether its prompt is documented, where."""

    key: str
    label: str
    prompt: str
    output: str  # "csv", "code", "text", "html", "json", "otsl"
    source: str
    documented: bool = True
    needs_schema: bool = False
    needs_question: bool = False
    #: How the schema is written into the prompt: ``None`` for one compact line, else this indent.
    schema_indent: int | None = None


PRESETS = {preset.key: preset for preset in [
    Preset("chart2csv", "Chart to CSV", "<chart2csv>", "csv", CARD_40),
    Preset("chart2summary", "Chart to summary", "<chart2summary>", "text", CARD_40),
    Preset("chart2code", "Chart to Python code", "<chart2code>", "code", CARD_40),
    Preset("tables_html", "Table to HTML", "<tables_html>", "html", CARD_40),
    Preset("tables_json", "Table to JSON", "<tables_json>", "json", CARD_40),
    Preset("tables_otsl", "Table to OTSL", "<tables_otsl>", "otsl", CARD_40),
    Preset("kvp", "Key-value extraction (JSON schema)", KVP_PROMPT_TEMPLATE, "json", TRANSFORMERS_DOC,
           documented=False, needs_schema=True),
    Preset("kvp_varex", "Key-value extraction, VAREX wording (for the real model)", VAREX_KVP_PROMPT_TEMPLATE,
           "json", VAREX, needs_schema=True, schema_indent=2),
    Preset("qa", "Document question", "{question}", "text", CARD_33, needs_question=True),
]}


def get_preset(key: str) -> Preset:
    """The preset named ``key``, or one line listing the known ones."""
    if key not in PRESETS:
        raise G4VError(f"unknown task {key!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[key]


def parse_schema(text: str) -> dict:
    """A user's JSON schema text as a dict, checked to be a valid JSON Schema, or one line saying why not."""
    from jsonschema import SchemaError, validators

    from g4v.documents.structured import UNTIMED, schema_pattern_problem, untimed_patterns

    if not text or not text.strip():
        raise G4VError("key-value extraction needs a JSON schema (the fields to extract)")
    if len(text) > MAX_SCHEMA_CHARS:
        raise G4VError(f"the JSON schema is too long: {len(text):,} characters (the limit is {MAX_SCHEMA_CHARS:,})")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise G4VError(f"the JSON schema is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    except RecursionError:
        raise G4VError("the JSON schema is nested too deeply") from None
    if not isinstance(schema, dict):
        raise G4VError(f"the JSON schema must be a JSON object, not {type(schema).__name__}")
    if not isinstance(schema.get("$schema", ""), str):
        raise G4VError("the JSON schema's $schema must be a string (the URI of a JSON Schema draft)")
    try:
        validators.validator_for(schema).check_schema(schema)
    except RecursionError:
        raise G4VError("the JSON schema is nested too deeply") from None
    except OverflowError as err:  # compiling a pattern such as a{99999999999}
        raise G4VError(f"the JSON schema has a pattern that cannot be compiled: {err}") from None
    except SchemaError as err:
        where = "/".join(str(part) for part in err.path) or "(top level)"
        raise G4VError(f"the JSON schema is not a valid JSON Schema at {where}: {err.message[:200]}") from None
    if untimed_patterns(schema):
        raise G4VError(UNTIMED)
    if problem := schema_pattern_problem(schema):
        raise G4VError(problem)
    return schema


def build_prompt(key: str, question: str = "", schema_text: str = "") -> str:
    """The text to send for task ``key``: the documented tag, the user's question, or the key-value
    prompt around the user's (checked) schema."""
    preset = get_preset(key)
    if preset.needs_schema:
        schema = parse_schema(schema_text)
        return preset.prompt.format(schema=json.dumps(schema, ensure_ascii=False, indent=preset.schema_indent))
    if preset.needs_question:
        if not question or not question.strip():
            raise G4VError("a document question needs the question itself")
        return question
    return preset.prompt
