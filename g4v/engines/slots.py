"""The KV cache of the requests the decode loop runs together: one row (slot) per request.

transformers' ``StaticCache`` writes every row of a batch at one shared position, which suits one
``generate`` call; requests that join and leave a running batch each have their own length. Here
each row keeps its own: row ``r`` holds ``lengths[r]`` tokens, a decode step writes row ``r``'s new
key and value at index ``lengths[r]`` (also its rotary position), and the attention mask lets
row ``r`` read indices ``0 .. lengths[r]`` only. Rows in use are ``0 .. n - 1``; a request that
ends hands its row to the last one (one row copied), so the rows in use stay contiguous and a step
on ``n`` rows is a plain slice of the buffers.

A prefill runs alone (transformers' own ``DynamicCache``, exactly as ``generate`` prefills), and its
keys and values are copied into a free row (:meth:`Slots.add`).

Shapes, per language-model layer: keys and values ``(rows, kv_heads, capacity, head_dim)``. The
capacity doubles when a row needs more (up to the model's context window). A compiled decode step
takes the whole buffers as inputs (fixed addresses for CUDA graphs, written in place) and has one
shape: ``batch`` rows (a bucket: 1, 2, 4 ... ``rows``) and ``window`` key positions (the capacity).
"""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

#: The smallest capacity allocated, in tokens per row.
MIN_CAPACITY = 256


class _StepLayer(CacheLayerMixin):
    """One layer's view of the slots for one step: ``update`` writes each row's new key and value
    at that row's position and returns the first ``window`` positions of the first ``batch`` rows.
    The tensors are bound for each call (:meth:`StepCache.bind`), so a compiled step takes them
    as its inputs and writes them in place."""

    is_compileable = True
    is_sliding = False

    def __init__(self, batch: int, window: int):
        super().__init__()
        self.batch, self.window = batch, window
        self.keys = self.values = self.positions = self.rows = None
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # allocated by Slots
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys[self.rows, :, self.positions] = key_states[:, :, 0]
        self.values[self.rows, :, self.positions] = value_states[:, :, 0]
        return self.keys[:self.batch, :, :self.window], self.values[:self.batch, :, :self.window]

    def get_seq_length(self) -> int:
        return 0  # positions are per row and passed in; nothing reads a shared length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.window, 0

    def get_max_length(self) -> int:
        return self.window

    def get_max_cache_shape(self) -> int:
        return self.window


class StepCache(Cache):
    """What a decode step passes as ``past_key_values``: ``batch`` rows of ``window`` positions."""

    def __init__(self, layers: int, batch: int, window: int):
        super().__init__(layers=[_StepLayer(batch, window) for _ in range(layers)])
        self.batch, self.window = batch, window

    def sized(self, window: int, whole: bool = False) -> "StepCache":
        """The same cache reading ``window`` positions (one cache per batch size: an eager step's
        window grows by one each step, and a new cache of 40 layers a step was pure overhead).
        ``whole``: every row reads all ``window`` positions (all rows hold ``window - 1`` tokens), so
        the step passes no mask; the cache then says it is no compileable one, which is what lets
        transformers skip building a causal mask from a shared cache position it does not have
        (its SDPA path without a mask, as a batch-of-one ``generate`` runs)."""
        self.window = window
        for layer in self.layers:
            layer.window, layer.is_compileable = window, not whole
        return self

    def bind(self, keys: list[torch.Tensor], values: list[torch.Tensor], positions: torch.Tensor) -> "StepCache":
        """Point every layer at its slot buffers (whole: ``(rows, heads, capacity, dim)``) and the
        rows' positions ``(batch,)``, for one call."""
        rows = torch.arange(self.batch, device=positions.device)  # once a step, not once a layer
        for layer, layer_keys, layer_values in zip(self.layers, keys, values):
            layer.keys, layer.values, layer.positions, layer.rows = layer_keys, layer_values, positions, rows
        return self


class Slots:
    """Keys and values of up to ``rows`` requests, each row with its own length."""

    def __init__(self, rows: int, device: torch.device, limit: int, text_config=None, dtype: torch.dtype | None = None):
        """``text_config`` and ``dtype``: the language model's, to allocate before the first prefill
        (without them the shapes are taken from the first prefill's cache)."""
        self.layers = 0  # known from the config, or at the first prefill
        self.rows, self.device, self.limit = rows, torch.device(device), limit
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = 0
        #: Tokens held per row (python ints, rows in use only), and the same as a tensor for the step.
        self.lengths: list[int] = []
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        self._shapes: list[tuple[int, int, torch.dtype]] = []  # (kv heads, head dim, dtype) per layer
        if text_config is not None:
            heads = text_config.num_key_value_heads
            dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
            self._shapes = [(heads, dim, dtype)] * text_config.num_hidden_layers
            self.layers = len(self._shapes)
        self._steps: dict[tuple[int, int], StepCache] = {}

    @property
    def used(self) -> int:
        return len(self.lengths)

    def add(self, prefill: Cache, length: int) -> int:
        """Copy a batch-of-one prefill's keys and values (``length`` tokens) into the next free row;
        returns the row."""
        row = self.used
        if row >= self.rows:
            raise RuntimeError("no free slot")
        if not self._shapes:  # first use: the model's own key and value shapes
            self._shapes = [(layer.keys.shape[1], layer.keys.shape[3], layer.keys.dtype) for layer in prefill.layers]
            self.layers = len(self._shapes)
        self.reserve(length + 1)
        for index, layer in enumerate(prefill.layers):
            self.keys[index][row, :, :length] = layer.keys[0, :, :length]
            self.values[index][row, :, :length] = layer.values[0, :, :length]
        self.lengths.append(length)
        return row

    def drop(self, row: int) -> None:
        """Free ``row``: the last row in use moves into it."""
        last = self.used - 1
        if row != last:
            for keys, values in zip(self.keys, self.values):
                keys[row].copy_(keys[last])
                values[row].copy_(values[last])
            self.lengths[row] = self.lengths[last]
        self.lengths.pop()

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` per row: the capacity doubles (from :data:`MIN_CAPACITY`) until it fits."""
        if tokens <= self.capacity:
            return
        if tokens > self.limit:
            raise RuntimeError(f"{tokens} tokens exceed the slots' limit of {self.limit}")
        capacity = max(self.capacity, MIN_CAPACITY)
        while capacity < tokens:
            capacity *= 2
        capacity = min(capacity, self.limit)
        grown = [torch.zeros(self.rows, heads, capacity, dim, dtype=dtype, device=self.device)
                 for heads, dim, dtype in self._shapes]
        grown_values = [torch.zeros_like(keys) for keys in grown]
        for old, new in zip(self.keys + self.values, grown + grown_values):
            new[:, :, :self.capacity] = old
        self.keys, self.values, self.capacity = grown, grown_values, capacity
        self._steps.clear()  # step caches point at the old buffers
        if self.device.type == "cuda":  # fixed addresses: a CUDA graph writes them in place
            for tensor in [*self.keys, *self.values, self.positions]:
                torch._dynamo.mark_static_address(tensor)

    def step(self, batch: int, window: int, fixed: bool = True) -> tuple[StepCache, torch.Tensor, torch.Tensor | None]:
        """``(cache, positions, mask)`` for a decode step over the first ``batch`` rows reading
        ``window`` positions: each row in use writes at its length, rows past them (a bucket's
        padding) at position 0; the mask lets each row read up to its own position. Not ``fixed``
        (an eager step) with every row of one length and the window just past it: no mask."""
        lengths = self.lengths + [0] * (batch - self.used)
        self.positions[:batch].copy_(torch.tensor(lengths, dtype=torch.long), non_blocking=True)
        positions = self.positions[:batch]
        cache = self._steps.get(batch)
        if cache is None:
            cache = self._steps[batch] = StepCache(self.layers, batch, window)
        if not fixed and batch == self.used and len(set(self.lengths)) == 1 and window == self.lengths[0] + 1:
            return cache.sized(window, whole=True), positions, None
        mask = (torch.arange(window, device=self.device)[None, :] <= positions[:, None])[:, None, None, :]
        return cache.sized(window), positions, mask

    def release(self) -> None:
        """Let go of the buffers (the loop is closed)."""
        self.keys, self.values, self.capacity, self.lengths = [], [], 0, []
        self._steps.clear()

    def advance(self) -> None:
        """After a step: every row in use holds one token more."""
        self.lengths = [length + 1 for length in self.lengths]
