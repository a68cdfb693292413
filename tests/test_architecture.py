"""The layout rules of docs/architecture.md, checked on the source: who may import whom, no cycles,
small modules. Imports are read with ``ast`` (function-level imports included), so a rule broken in
a rarely run branch still fails here."""

import ast
from pathlib import Path

import pytest

from g4v.commands.panels import PANELS as PANEL_REGISTRY
from g4v.paths import REPO_ROOT

SOURCE_ROOTS = ("g4v", "webapp", "viz")
MAX_LINES = 450

#: The layers, lowest first: a module may import its own layer and the ones below, never above.
BASE = ("g4v.errors", "g4v.paths", "g4v.settings", "g4v.checkpoint", "g4v.conversation", "g4v.images", "g4v.loading", "g4v.tiling",
        "g4v.engines", "g4v.model")
#: Each panel's package (``g4v.commands.panels.PANELS``; Tiling's and Chat's work is in the base), and
#: the documents package, which has no tab of its own (PDF pages and presets serve every tab).
PANELS = (*(panel.package for panel in PANEL_REGISTRY if panel.package and panel.package not in BASE), "g4v.documents")
FRONTS = ("g4v.commands", "g4v.cli", "g4v.__main__", "g4v.demo", "webapp", "app")
#: What more than one panel needs, which panels import instead of each other: the shared layer
#: (``g4v.model``: levels, hooks, capture, scoring and KL, bench helpers, the export store) and the
#: LoRA package's adapter handling (finding, checking, activating and listing adapters), which
#: every engine user of an adapter comes through (Chat, LoRA, Evaluate); and the documents
#: package's answer parsing and scores (pure functions of answer text: tables, key-value leaves),
#: which Evaluate's per-field scores of document datasets use.
SHARED = ("g4v.model", "g4v.lora.folders", "g4v.lora.checks", "g4v.lora.activation", "g4v.lora.choices",
          "g4v.documents.tables", "g4v.documents.metrics")


def tab_modules(panel_id: str) -> tuple[str, ...]:
    """A panel's tab module, ``webapp/<id>.py``, and the modules beside it, ``webapp/<id>_*.py``."""
    return tuple(f"webapp.{path.stem}" for path in sorted((REPO_ROOT / "webapp").glob(f"{panel_id}*.py"))
                 if path.stem == panel_id or path.stem.startswith(f"{panel_id}_"))


#: Each panel's fronts (its tab and its commands), by its package: they import their own panel, the
#: shared layer and the base, never another panel.
PANEL_FRONTS = {panel.package: tab_modules(panel.id) + tuple(f"g4v.commands.{command.replace('-', '_')}"
                                                             for command in panel.commands)
                for panel in PANEL_REGISTRY if panel.package}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_files() -> list[Path]:
    files = [REPO_ROOT / "app.py"]
    for root in SOURCE_ROOTS:
        files.extend(sorted((REPO_ROOT / root).rglob("*.py")))
    return files


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    module_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in module_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            name = node.module
            if node.level:
                package = module_name(path).split(".")
                name = ".".join(package[: len(package) - node.level + (path.name == "__init__.py")] + [name])
            found.append((name, id(node) in module_level))
            found += [(f"{name}.{alias.name}", id(node) in module_level) for alias in node.names]
    return found


def group(name: str, groups) -> str | None:
    return next((g for g in groups if name == g or name.startswith(g + ".")), None)


def own_imports():
    for path in source_files():
        me = module_name(path)
        for target, at_top in imports_of(path):
            if target.split(".")[0] in ("g4v", "webapp", "viz", "app"):
                yield path, me, target, at_top


def test_viz_draws_without_the_model_code():
    offenders = [(m, t) for _, m, t, _ in own_imports() if m.startswith("viz") and not t.startswith("viz")]
    assert offenders == []


def test_the_library_never_imports_the_web_ui_commands_or_the_demo():
    offenders = [(m, t) for _, m, t, _ in own_imports()
                 if group(m, BASE + PANELS) and (group(t, FRONTS))]
    assert offenders == []


def test_base_modules_never_import_a_panel():
    offenders = [(m, t) for _, m, t, _ in own_imports() if group(m, BASE) and group(t, PANELS)]
    assert offenders == []


def panel_of(module: str) -> str | None:
    """The panel a module belongs to (its package, or the panel whose tab or command it is). A
    panel whose work is in the base (Tiling's plan, which every heatmap reads) owns its fronts only."""
    own = group(module, PANELS + tuple(package for package in PANEL_FRONTS if not group(package, BASE)))
    if own:
        return own
    return next((panel for panel, fronts in PANEL_FRONTS.items() if group(module, fronts)), None)


def test_panels_and_their_fronts_import_no_other_panel_but_through_the_shared_layer():
    """A panel (and its tab and command) reaches what another panel also needs through the shared
    layer (:data:`SHARED`), never into that panel: what two panels share moves down."""
    offenders = sorted({(m, t) for _, m, t, _ in own_imports()
                        if (mine := panel_of(m)) and (theirs := panel_of(t)) and theirs != mine
                        and not group(t, SHARED)})
    assert offenders == []


def test_no_import_cycles_among_modules():
    """The imports form a DAG, those inside functions included: an import deferred to a function
    (to load torch or vLLM late) still ties the two modules together, and a circle of them is two
    modules that each need the other."""
    modules = {module_name(p) for p in source_files()}
    graph = {m: set() for m in modules}
    for _, me, target, _ in own_imports():
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != me:
            graph[me].add(target)

    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_nothing_imports_an_entry_point():
    """``app.py`` and the ``__main__`` modules are the top: they import, nothing imports them."""
    offenders = [(m, t) for _, m, t, _ in own_imports() if t == "app" or t.endswith(".__main__")]
    assert offenders == []


def test_the_demo_imports_no_other_front():
    """The demo (the bundled checkpoints' builder and trainer, and their pictures) is the lowest
    front: the commands may draw its pictures (the pointing game), so it uses no command, app or
    CLI, its own command line included (which reads its flags with ``g4v.settings.flags``, in the
    library). That keeps the fronts free of circles and of imports that run back up."""
    offenders = [(m, t) for _, m, t, _ in own_imports()
                 if group(m, FRONTS) == "g4v.demo" and group(t, FRONTS) not in (None, "g4v.demo")]
    assert offenders == []


def test_modules_stay_small():
    long = {str(p.relative_to(REPO_ROOT)): n for p in source_files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    assert len((REPO_ROOT / "app.py").read_text().splitlines()) < 200


def test_at_most_ten_loose_modules_in_g4v():
    loose = sorted(p.name for p in (REPO_ROOT / "g4v").glob("*.py"))
    assert len(loose) <= 10, loose


def test_nothing_outside_the_engines_touches_their_private_state():
    offenders = []
    for path in source_files():
        if module_name(path).startswith("g4v.engines"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and "engine" in owner.id:
                    offenders.append(f"{path.name}: {owner.id}.{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
                args = node.args
                if len(args) >= 2 and isinstance(args[1], ast.Constant) and str(args[1].value).startswith("_") \
                        and isinstance(args[0], ast.Name) and "engine" in args[0].id:
                    offenders.append(f"{path.name}: getattr({args[0].id}, {args[1].value!r})")
    assert offenders == []


def test_typed_results_turn_into_dicts_by_one_name():
    """``to_dict`` is the one name for "this result as plain data" (``to_json`` returns JSON text)."""
    offenders = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                offenders += [f"{path.name}: {node.name}.{item.name}" for item in node.body
                              if isinstance(item, ast.FunctionDef) and item.name in ("summary", "as_dict", "asdict", "to_json")
                              and not (isinstance(item.returns, ast.Name) and item.returns.id == "str")]
    assert offenders == []


def test_answer_length_defaults_are_written_once():
    """A request kind's default answer length lives in one named place (a settings dataclass
    field or a constant: ``SamplingSettings.max_new_tokens``, ``AttributionSettings``,
    ``EvalConfig``, ``CONTINUATION_TOKENS``, ``DIFF_TOKENS``, ``COMPARED_TOKENS``); a function
    parameter, a ``--max-new-tokens`` flag or a tab's slider reads it instead of repeating the
    number, so the CLI and the tab cannot drift apart. (The demo's trainers are no request kind.)"""
    offenders = []
    for path in source_files():
        if module_name(path).startswith("g4v.demo"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs
                defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults + node.args.kw_defaults
                offenders += [f"{path.name}:{node.lineno} {node.name}({arg.arg}={default.value})"
                              for arg, default in zip(args, defaults)
                              if arg.arg == "max_new_tokens" and isinstance(default, ast.Constant) and default.value]
            elif isinstance(node, ast.Call):
                first = node.args[0] if node.args else None
                is_flag = isinstance(first, ast.Constant) and first.value == "--max-new-tokens"
                is_slider = any(k.arg == "label" and isinstance(k.value, ast.Constant) and k.value.value == "Max new tokens"
                                for k in node.keywords)
                offenders += [f"{path.name}:{node.lineno} {k.arg}={k.value.value}" for k in node.keywords
                              if (is_flag and k.arg == "default" or is_slider and k.arg == "value")
                              and isinstance(k.value, ast.Constant)]
    assert offenders == []


#: Event listener methods: their first argument (or ``fn=``) is a handler.
EVENT_METHODS = {"click", "change", "submit", "upload", "select", "input", "success", "then", "failure", "blur",
                 "focus", "load", "unload", "clear", "release", "stream", "like", "edit", "delete", "retry"}


def _tuple_results(function) -> list[int]:
    """Lines where ``function`` (a def or a lambda) returns or yields a tuple literal of several items;
    nested functions are their own."""
    if isinstance(function, ast.Lambda):
        body = function.body
        return [function.lineno] if isinstance(body, ast.Tuple) and len(body.elts) > 1 else []
    found, todo = [], list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, (ast.Return, ast.Yield)) and isinstance(node.value, ast.Tuple) and len(node.value.elts) > 1:
            found.append(node.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _handlers(tree: ast.Module):
    """Every function the module wires to an event: a lambda given to a listener, or a function of
    the module given by name (directly, or as what a ``make_...`` factory of the module returns, or
    wrapped in ``functools.partial``)."""
    functions: dict[str, list] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, []).append(node)

    def resolve(expr, depth=0):
        if depth > 3 or expr is None:
            return []
        if isinstance(expr, ast.Lambda):
            return [expr]
        if isinstance(expr, ast.Name):
            return functions.get(expr.id, [])
        if isinstance(expr, ast.Call):
            name = getattr(expr.func, "id", None) or getattr(expr.func, "attr", None)
            if name == "partial" and expr.args:
                return resolve(expr.args[0], depth + 1)
            made = []
            for factory in functions.get(name, []):  # a factory: the handlers it returns
                for node in ast.walk(factory):
                    if isinstance(node, ast.Return) and node.value is not None:
                        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                        made += [f for value in values for f in resolve(value, depth + 1)]
            return made
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EVENT_METHODS:
            given = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "fn"), None)
            yield from resolve(given)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Examples":
            yield from resolve(next((k.value for k in node.keywords if k.arg == "fn"), None))


def test_tab_handlers_return_by_box():
    """A tab's handler returns ``{box: value}`` (its boxes a ``webapp.common.OutputBoxes``), never a
    tuple that must be kept in step with the event's outputs list by hand: no function or lambda
    wired to an event in ``webapp/`` returns or yields a tuple literal of several items (a helper
    that does is no handler). docs/architecture.md, "Where a new panel goes"."""
    offenders = []
    for path in sorted((REPO_ROOT / "webapp").glob("*.py")):
        for handler in _handlers(ast.parse(path.read_text())):
            offenders += [f"{path.name}:{line} {getattr(handler, 'name', 'lambda')}" for line in _tuple_results(handler)]
    assert sorted(set(offenders)) == []


#: The engine classes a caller outside ``g4v/engines`` must not test for (its abilities are interfaces).
ENGINE_CLASSES = {"TransformersEngine", "VLLMEngine", "RemoteEngine", "DeferredEngine"}


def _is_engine_name(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "engine" or name.startswith("engine_")


def test_callers_ask_engines_by_interface_not_by_backend_class_or_getattr():
    """Outside ``g4v/engines`` no code asks an engine what it can do by its backend's name
    (``engine.info.backend == ...``), its class (``isinstance(engine, TransformersEngine)``) or an
    attribute probe (``getattr(engine, "encoded", None)``, ``hasattr``): it asks
    ``engine.supports(Instrumentable)`` or takes ``require(engine, Instrumentable, purpose)``
    (g4v/engines/capabilities.py). docs/architecture.md, the layer rules."""
    offenders = []
    files = [path for path in source_files() if not module_name(path).startswith("g4v.engines")]
    for path in files + [REPO_ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("getattr", "hasattr") and node.args and _is_engine_name(node.args[0]):
                    offenders.append(f"{where} {node.func.id}(engine, ...)")
                if node.func.id == "isinstance" and len(node.args) == 2:
                    classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                    named = {c.id if isinstance(c, ast.Name) else getattr(c, "attr", "") for c in classes}
                    offenders += [f"{where} isinstance(..., {name})" for name in named & ENGINE_CLASSES]
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    if (isinstance(side, ast.Attribute) and side.attr == "backend"
                            and isinstance(side.value, ast.Attribute) and side.value.attr == "info"):
                        offenders.append(f"{where} compares engine.info.backend")
    assert offenders == []


def _environment_reads(node: ast.AST) -> list[ast.AST]:
    """The ``G4V_*`` variables read in ``node``'s own code, functions' and lambdas' bodies left
    out (they run when called): ``os.environ.get("G4V_X")``, ``os.environ["G4V_X"]``,
    ``os.getenv("G4V_X")``, ``"G4V_X" in os.environ``."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return []

    def names_environ(expr) -> bool:
        return (isinstance(expr, ast.Attribute) and expr.attr == "environ") or (isinstance(expr, ast.Name)
                                                                               and expr.id == "environ")

    def g4v_names(*exprs) -> bool:
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.startswith("G4V_")
                   for expr in exprs for e in ast.walk(expr))

    found = []
    if isinstance(node, ast.Call):
        func = node.func
        reads = (isinstance(func, ast.Attribute) and (func.attr == "getenv" or names_environ(func.value))) or (
            isinstance(func, ast.Name) and func.id == "getenv")
        if reads and g4v_names(*node.args):
            found.append(node)
    if isinstance(node, ast.Subscript) and names_environ(node.value) and g4v_names(node.slice):
        found.append(node)
    if isinstance(node, ast.Compare) and any(names_environ(c) for c in node.comparators) and g4v_names(node.left):
        found.append(node)
    for child in ast.iter_child_nodes(node):
        found += _environment_reads(child)
    return found


def test_no_module_reads_g4v_variables_at_import():
    """The environment is read at start, not at import: a ``G4V_*`` variable is read inside a
    function (a setting's ``from_environment``, :func:`g4v.settings.limits.limits` the first time
    it is asked, ``app.parse_args``), never by a module's own code, so what is set before the
    first use is heard and a bad value is one line at start rather than a traceback at import."""
    files = source_files() + sorted((REPO_ROOT / "scripts").glob("*.py"))
    offenders = [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for path in files
                 for node in _environment_reads(ast.parse(path.read_text()))]
    assert offenders == []


#: The model's own module names that only ``g4v/model/sites.py`` writes: a decoder layer's attention,
#: the projectors, and the decoder layers read off the language model (``language_model.layers``,
#: vLLM's ``language_model.model.layers``).
MODULE_NAMES = {"self_attn", "layerwise_projectors", "spatial_projectors"}


def test_capture_points_are_found_by_name_through_one_resolver():
    """Outside ``g4v/model/sites.py`` no code walks the model to a module to hook it (or to touch
    it): ``language_model.layers[i].self_attn``, ``model.model.layerwise_projectors``; it names the
    capture point, ``site(model, "layers.3.self_attn")``, and the one resolver finds it in
    transformers' model or in vLLM's. docs/architecture.md, "Where a shared capability goes"."""
    offenders = []
    for path in source_files():
        if module_name(path) == "g4v.model.sites":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
            if node.attr in MODULE_NAMES or node.attr == "layers" and owner in ("language_model", "model"):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {owner}.{node.attr}")
    assert offenders == []
