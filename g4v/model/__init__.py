"""The shared layer: what Granite 4 Vision is to every panel, and what more than one panel needs.

Panels (Deepstack, LoRA, Port, Evaluate, Attribution) import these modules, never each other. The
package reads from the bottom up; each module imports only those above it in this list:

* :mod:`g4v.model.levels`: the 8 injection levels read from the config, and checked
  ``{level: factor}`` requests (no torch, so requests are checked before any model runs);
* :mod:`g4v.model.hooks`: the one place forward hooks are added to a model and removed again;
* :mod:`g4v.model.sites`: the capture points declared once by name (``language_model``,
  ``layers.{i}``, ``layers.{i}.self_attn``, the projectors), and the one resolver of a name to its
  module, in transformers' model and in vLLM's;
* :mod:`g4v.model.capture`: hooks that record (and scale) what one forward pass injects;
* :mod:`g4v.model.scoring`: next-token distributions, greedy continuations, teacher-forced answer
  logits, and the one KL divergence every panel compares distributions with;
* :mod:`g4v.model.bench`: what every model benchmark shares (models, synthetic inputs, timing and
  peak memory, the flags' checks);
* :mod:`g4v.model.exports`: the bounded, self-cleaning folder the app's exports go to (every panel
  that exports files, and the visitors' stores in ``webapp.sessions``).
"""

#: Requests the transformers engine runs as one padded batch (``generate_batch``, batched
#: scoring): where a 2-core CPU stops gaining from larger batches on the bundled checkpoints.
#: Here, in the shared layer, because the engines and the scoring below them both batch by it.
BATCH_SIZE = 8
