"""Samples prepared once per engine for one chunk of a dataset run: what an arm's answers, the blank
probes, teacher-forced scoring and the per-level norms of the same rows share (each picture
validated, processed and, on the transformers engine, encoded once; see :mod:`g4v.model.encoding`).
"""

from g4v.conversation import Message
from g4v.engines.base import Engine, PreparedRequest
from g4v.engines.capabilities import Instrumentable
from g4v.errors import G4VError


def cuts_tokens(budget) -> bool:
    """Whether a token budget drops image tokens (then the request is ranked and cut from its pixel
    values, and its pictures cannot be encoded ahead of the cut)."""
    return budget is not None and not budget.plain


class Requests:
    """Samples prepared for engines, each (engine, sample) once: what the answers, the blank
    probes, teacher-forced scoring and per-level norms of the same rows share. A transformers
    engine's requests also carry their pictures encoded (vision tower and projectors once for all
    those passes, :meth:`~g4v.engines.hf.TransformersEngine.encoded`). Keyed by object identity
    (a blanked copy is a sample of its own) and kept for one chunk of rows."""

    def __init__(self):
        self._made: dict[tuple, tuple[object, PreparedRequest | G4VError]] = {}

    def get(self, engine: Engine, sample, max_new_tokens: int = 0, budget=None, adapter: str | None = None
            ) -> PreparedRequest:
        """The prepared request (a G4VError for a sample the engine refuses, raised each time);
        with a token ``budget`` that cuts, the request with only its kept image tokens (ranked with
        ``adapter``), made once from the full one."""
        if cuts_tokens(budget):
            from g4v.model.token_budget import reduce_request

            key = (id(engine), id(sample), budget, adapter)
            if key not in self._made:  # ranked and cut from the pixel values, then encoded
                self._made[key] = (sample, reduce_request(engine, self._prepared(engine, sample), budget, adapter))
            return engine.prepare(self._made[key][1], max_new_tokens)
        self.encode(engine, [sample])
        made = self._made[self._encoded_key(engine, sample)][1]
        if isinstance(made, G4VError):
            raise made
        return engine.prepare(made, max_new_tokens)  # a prepared request: only the room is checked

    def encode(self, engine: Engine, samples: list, batch_size: int = 1) -> None:
        """Prepare ``samples`` and, on an engine that can (:class:`Instrumentable`), encode their pictures,
        ``batch_size`` requests together (:meth:`~g4v.engines.hf.TransformersEngine.encoded`); each once."""
        ready = []
        for sample in samples:
            if self._encoded_key(engine, sample) in self._made:
                continue
            try:
                ready.append((sample, self._prepared(engine, sample)))
            except G4VError as err:
                self._made[self._encoded_key(engine, sample)] = (sample, err)
        local = engine.capable(Instrumentable)  # its model runs here: the pictures can go through it once
        made = local.encoded([request for _, request in ready], batch_size) if local and ready else [r for _, r in ready]
        for (sample, _), request in zip(ready, made):
            self._made[self._encoded_key(engine, sample)] = (sample, request)

    @staticmethod
    def _encoded_key(engine: Engine, sample) -> tuple:
        return (id(engine), id(sample), "encoded")

    def _prepared(self, engine: Engine, sample) -> PreparedRequest:
        key = (id(engine), id(sample))
        if key not in self._made:
            try:
                made = engine.prepare([Message("user", sample.prompt, list(sample.images))])
            except G4VError as err:
                made = err
            self._made[key] = (sample, made)  # the sample is kept so that its id stays its own
        made = self._made[key][1]
        if isinstance(made, G4VError):
            raise made
        return made
