"""The training aids of the demo model: extra losses that give a tiny model, trained from scratch
in a CPU budget, a signal where the answer tokens alone give almost none.

They are used during training only (:mod:`g4v.demo.loop` builds them from the settings and
removes them again): the saved checkpoint is a plain Granite 4 Vision. Each one was needed
(docs/demo-model.md, "How this recipe was found", has what happened without it):

* **a dense signal on all 8 levels** (:class:`FeatureProbe`): throw-away linear probes on each
  projector's output must tell, for every base-view feature, the colour, shape and place of what lies
  under it. The vision tower and the 8 Q-Formers get gradients from 64 cells per picture instead of
  from a few answer tokens;
* **a pointer for binding** (:class:`AttentionPointer`): one attention head of a late language-model
  layer is asked to look, from each answer-predicting position, at the image tokens of the shape the
  question names. It teaches the lookup ("the star" -> the star's cells -> its colour) that the
  model otherwise does not find in this budget; and a linear **readout** of what that head gathers
  must name the pointed-at shape's colour, shape and place, so that what is found is also what is
  read ("blue" and "black" share their first word pieces, so the colour is only decided where the
  head reads it);
* **a second pointer for the reverse lookup** ("What shape is red?" finds the shape by its colour),
  on another head, trained on those questions only, with its own readout; and a **count pointer**
  whose attention spreads evenly over every shape for "How many shapes?";
* **a vision tower that tells shapes apart** (:func:`object_shape_logits`): the pooled shape
  classifier of the vision-only warm-up (:func:`g4v.demo.loop.warm_up_vision`).
"""

import torch

from g4v.demo import shapes as S
from g4v.demo.data import answer_spans
from g4v.model.hooks import Hooks
from g4v.model.sites import site, site_names


class FeatureProbe(torch.nn.Module):
    """Auxiliary training signal: forward hooks keep the 8 projectors' outputs (views x 64 x hidden);
    linear heads classify each base-view feature's colour and shape (background included)."""

    def __init__(self, model, place: bool = False):
        super().__init__()
        self.place = place
        names = site_names(model, "layerwise_projectors.{i}") + site_names(model, "spatial_projectors.{i}")
        self.projectors = [site(model, name) for name in names]
        hidden = model.config.text_config.hidden_size
        self.heads = torch.nn.ModuleList(
            [torch.nn.Linear(hidden, 1 + len(S.COLOURS) + 1 + len(S.SHAPES) + (1 + len(S.PLACES)) * place)
             for _ in self.projectors])
        self.outputs: list = [None] * len(self.projectors)
        #: Mean over levels of the share of object cells whose attributes the heads got right (last batch).
        self.accuracy: dict[str, float] = {}
        self.config = model.config
        self._hooks = Hooks()
        for i, proj in enumerate(self.projectors):
            self._hooks.after(proj, self._keeper(i))
        weights = torch.ones(1 + max(len(S.COLOURS), len(S.SHAPES), len(S.PLACES)))
        weights[0] = 0.3  # background is most cells
        self.register_buffer("class_weights", weights, persistent=False)

    def _keeper(self, i):
        def hook(module, args, output):
            self.outputs[i] = output
        return hook

    def remove(self) -> None:
        self._hooks.remove()

    def loss(self, pictures: list[S.Picture], image_sizes: torch.Tensor) -> torch.Tensor:
        from transformers.models.granite4_vision.modeling_granite4_vision import image_size_to_num_patches

        counts = [image_size_to_num_patches(size, self.config.image_grid_pinpoints, self.config.vision_config.image_size)
                  for size in image_sizes.tolist()]
        base_views = torch.tensor([sum(counts[:i]) for i in range(len(counts))])
        labels = [S.feature_labels(p) for p in pictures]
        device = self.class_weights.device
        colour = torch.tensor([c for c, _, _ in labels], device=device).flatten()
        shape = torch.tensor([s for _, s, _ in labels], device=device).flatten()
        place = torch.tensor([p for _, _, p in labels], device=device).flatten()
        nc, ns = 1 + len(S.COLOURS), 1 + len(S.SHAPES)
        total = 0.0
        on_object = colour > 0
        right = {"colour": 0.0, "shape": 0.0, **({"place": 0.0} if self.place else {})}
        for head, out in zip(self.heads, self.outputs):
            logits = head(out[base_views]).flatten(0, 1)  # (images * 64, classes)
            with torch.no_grad():  # how well each level tells the object cells' attributes (a diagnostic)
                for name, cols, target in (("colour", slice(0, nc), colour), ("shape", slice(nc, nc + ns), shape),
                                           ("place", slice(nc + ns, None), place)):
                    if name in right:
                        hits = logits[on_object, cols].argmax(-1) == target[on_object]
                        right[name] += hits.float().mean().item() / len(self.heads)
            total = total + torch.nn.functional.cross_entropy(logits[:, :nc], colour, weight=self.class_weights[:nc])
            total = total + torch.nn.functional.cross_entropy(logits[:, nc : nc + ns], shape,
                                                              weight=self.class_weights[:ns])
            if self.place:
                total = total + torch.nn.functional.cross_entropy(logits[:, nc + ns :], place,
                                                                  weight=self.class_weights[: 1 + len(S.PLACES)])
        self.outputs = [None] * len(self.projectors)
        self.accuracy = right
        return total / len(self.heads)


class AttentionPointer:
    """Auxiliary training signal for *binding*: at one language-model layer, one attention head of
    the token that predicts an answer should look at the image tokens of the shape the question
    names ("What colour is the star?" -> the star's cells, in the base view and in the tiles).

    Without it the tiny model learns what pooling the whole picture gives (how many shapes, the
    colour when there is one shape) and stalls there: finding one shape among a few hundred image
    tokens from a word several tokens back is a search with almost no gradient until attention is
    already sharp. A forward pre-hook keeps the layer's normalised input and rotary embeddings; the
    loss recomputes that head's attention logits for the answer-predicting positions only and asks
    for probability mass on the named shape's tokens (which tokens: :func:`g4v.tiling.plan_tiling`,
    the same token map the Tiling panel draws)."""

    def __init__(self, model, layer: int, head: int = 0, min_cover: float = 0.3, readout: bool = False,
                 kinds: frozenset[str] | None = None):
        self.attention = site(model, f"layers.{layer}.self_attn")
        self.head = head
        #: With ``readout``, a throw-away linear head on what the pointer head gathers (its attention
        #: output, before ``o_proj``) names the colour, shape and place of the shape pointed at. Finding
        #: the right shape is not enough if the values read there do not say what it is.
        self.readout = (torch.nn.Linear(self.attention.head_dim, len(S.COLOURS) + len(S.SHAPES) + len(S.PLACES),
                                        device=self.attention.q_proj.weight.device) if readout else None)
        self.min_cover = min_cover
        #: Question kinds (see :data:`g4v.demo.shapes.QUESTION_TYPES`) this pointer trains on; None = all.
        self.kinds = kinds
        self.config = model.config
        self.image_token = model.config.image_token_index
        self._hooks = Hooks()
        self._hooks.before(self.attention, self._keep, with_kwargs=True)
        self._inputs = None

    def _keep(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        self._inputs = (hidden, kwargs["position_embeddings"])

    def remove(self) -> None:
        self._hooks.remove()

    def shape_tokens(self, picture: S.Picture) -> list[list[int]]:
        """For each shape, the indices (in packing order) of the base/tile image tokens it covers."""
        return object_tokens(picture.mask, picture.size, len(picture.shapes), self.config, self.min_cover)

    def losses(self, batch: dict, pictures: list[S.Picture],
               plans: list[list[tuple[S.QA, int | None]]]) -> dict[str, torch.Tensor]:
        """``pointer``: minus the log attention mass on the named shape's tokens, averaged over the
        answer-predicting positions; ``readout`` (with a readout head): cross-entropy of its colour,
        shape and place predictions."""
        hidden, (cos, sin) = self._inputs
        self._inputs = None
        rows, queries, targets, named = [], [], [], []
        for row, (picture, plan) in enumerate(zip(pictures, plans)):
            image_positions = (batch["input_ids"][row] == self.image_token).nonzero().flatten()
            per_shape = self.shape_tokens(picture)
            for (qa, shape_index), answer in zip(plan, answer_spans(batch["labels"][row])):
                if self.kinds is not None and qa.kind not in self.kinds:
                    continue
                if shape_index is not None and per_shape[shape_index]:
                    shape_targets = [image_positions[per_shape[shape_index]]]
                    shape = picture.shapes[shape_index]
                elif qa.kind == "count" and self.kinds is not None:  # spread over every shape
                    shape_targets = [image_positions[tokens] for tokens in per_shape if tokens]
                    shape = None
                else:
                    continue
                if not shape_targets:
                    continue
                # Every position that predicts a word piece of the answer ("b" "l" "ue": blue or black is
                # only decided at the third piece) looks at the shape itself, not at the position before.
                for position in range(answer.start - 1, answer.stop - 2):
                    rows.append(row)
                    queries.append(position)
                    targets.append(shape_targets)
                    named.append(shape)
        return self._losses(hidden, cos, sin, rows, queries, targets, named)

    def segment_losses(self, batch: dict, items: list, tokenizer) -> dict[str, torch.Tensor]:
        """Document answers (the document stages): every position that predicts a token of one stretch of
        the answer looks at the object that stretch is about. Each item has ``mask`` (object ``i``
        drawn as value ``i + 1``), ``size``, ``objects`` (their number) and ``segments``: (first
        character, end character, object index) in its answer, such as a chart's CSV row and its
        bar, or one shape's JSON object and that shape; a tuple of indices spreads the attention
        evenly over those objects (as the count pointer does). Returns ``pointer`` as
        :meth:`losses` does."""
        hidden, (cos, sin) = self._inputs
        self._inputs = None
        rows, queries, targets = [], [], []
        for row, item in enumerate(items):
            image_positions = (batch["input_ids"][row] == self.image_token).nonzero().flatten()
            per_object = object_tokens(item.mask, item.size, item.objects, self.config, self.min_cover)
            answer = answer_spans(batch["labels"][row])[0]
            ends = token_ends(tokenizer, batch["input_ids"][row, answer.start:answer.stop].tolist())
            for k, index in segment_tokens(ends, item.segments):
                spread = [image_positions[per_object[i]] for i in (index if isinstance(index, tuple) else (index,))
                          if per_object[i]]
                if spread:
                    rows.append(row)
                    queries.append(answer.start + k - 1)  # the position predicting answer token k
                    targets.append(spread)
        return self._losses(hidden, cos, sin, rows, queries, targets, [None] * len(rows))

    def _losses(self, hidden, cos, sin, rows: list[int], queries: list[int], targets: list[list[torch.Tensor]],
                named: list) -> dict[str, torch.Tensor]:
        """The pointer loss (and readout) of the gathered (row, query position, target tokens)."""
        from transformers.models.granite4_vision.modeling_granite4_vision import apply_rotary_pos_emb

        attention = self.attention
        head_dim = attention.head_dim
        group = attention.num_key_value_groups
        if not rows:
            zero = hidden.new_zeros(())
            return {"pointer": zero, **({"readout": zero} if self.readout is not None else {})}
        batch_size, length, _ = hidden.shape
        query = attention.q_proj(hidden).view(batch_size, length, -1, head_dim).transpose(1, 2)
        key = attention.k_proj(hidden).view(batch_size, length, -1, head_dim).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        total, gathered = hidden.new_zeros(()), []
        for row, position, shape_targets in zip(rows, queries, targets):
            q = query[row, self.head, position]  # (head_dim,)
            k = key[row, self.head // group, : position + 1]  # (position + 1, head_dim): causal
            log_attention = torch.log_softmax((k @ q) * attention.scaling, dim=-1)
            # One shape: minus the log mass on it. Several (count questions): the mean of that over
            # the shapes, which is smallest when the mass is all on shapes and spread evenly.
            total = total - sum(torch.logsumexp(log_attention[t], dim=-1) for t in shape_targets) / len(shape_targets)
            gathered.append(log_attention)
        losses = {"pointer": total / len(rows)}
        if self.readout is not None:
            pointed = [i for i, shape in enumerate(named) if shape is not None]
            losses["readout"] = (self._readout_loss(hidden, [rows[i] for i in pointed], [gathered[i] for i in pointed],
                                                    [named[i] for i in pointed])
                                 if pointed else hidden.new_zeros(()))
        return losses

    def _readout_loss(self, hidden: torch.Tensor, rows: list[int], log_attentions: list[torch.Tensor],
                      named: list[S.Shape]) -> torch.Tensor:
        batch_size, length, _ = hidden.shape
        value = self.attention.v_proj(hidden).view(batch_size, length, -1, self.attention.head_dim).transpose(1, 2)
        kv_head = self.head // self.attention.num_key_value_groups
        outputs = torch.stack([log_attention.exp() @ value[row, kv_head, : len(log_attention)]
                               for row, log_attention in zip(rows, log_attentions)])  # (queries, head_dim)
        logits = self.readout(outputs)
        device = logits.device
        colours, shapes = len(S.COLOURS), len(S.SHAPES)
        colour, kind, place = torch.tensor([S.class_indices(s) for s in named], device=device).unbind(-1)
        cross_entropy = torch.nn.functional.cross_entropy
        return (cross_entropy(logits[:, :colours], colour) + cross_entropy(logits[:, colours:colours + shapes], kind)
                + cross_entropy(logits[:, colours + shapes:], place)) / 3


def object_tokens(mask, size: tuple[int, int], count: int, config, min_cover: float) -> list[list[int]]:
    """For each of ``count`` objects drawn in ``mask`` (an "L" picture, object ``i`` as value
    ``i + 1``) on a picture of ``size`` (width, height), the indices (in packing order) of the
    base/tile image tokens whose box it covers at least ``min_cover`` of."""
    import numpy as np

    from g4v.tiling import plan_tiling

    pixels = np.asarray(mask)
    plan = plan_tiling((size[1], size[0]), config)
    covered = [[] for _ in range(count)]
    for token in plan.tokens:
        left, top, right, bottom = (int(round(v)) for v in token.box)
        if token.kind == "newline" or right <= left or bottom <= top:
            continue
        cell = pixels[top:bottom, left:right]
        for index in range(count):
            if (cell == index + 1).mean() >= min_cover:
                covered[index].append(token.index)
    return covered


def token_ends(tokenizer, ids: list[int]) -> list[int]:
    """The character where each token's text ends in the decoded ``ids`` (decoding each prefix:
    a byte-level word piece need not be a whole character)."""
    return [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]


def segment_tokens(ends: list[int], segments) -> list[tuple[int, int]]:
    """(answer token, object index) for every token that starts inside a segment (first character,
    end character, object index), given where each token ends (:func:`token_ends`)."""
    found = []
    for k, (start, end) in enumerate(zip([0] + ends[:-1], ends)):
        found += [(k, index) for first, stop, index in segments if first <= start < stop and end > start]
    return found


def object_shape_logits(model, head: torch.nn.Linear, pictures: list[S.Picture], pixel_values: torch.Tensor):
    """Shape logits of every shape in the pictures' base views: the vision tower's last hidden state
    averaged over the patches the shape covers, through ``head``. Returns (logits, shape labels)."""
    from PIL import Image

    vision = model.model.vision_tower
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size
    hidden = vision(pixel_values=pixel_values[:, 0]).last_hidden_state  # (pictures, side * side, hidden)
    pooled, labels = [], []
    for row, picture in enumerate(pictures):
        patches = torch.tensor(list(picture.mask.resize((side, side), Image.NEAREST).getdata()),
                               device=hidden.device)
        for index, shape in enumerate(picture.shapes):
            under = patches == index + 1
            if under.any():
                pooled.append(hidden[row][under].mean(0))
                labels.append(S.SHAPES.index(shape.kind))
    return head(torch.stack(pooled)), torch.tensor(labels, device=hidden.device)
