"""The LoRA workbench: serve a PEFT LoRA adapter next to its base model, compare them, merge them.

What the app's LoRA tab and the CLI (``chat --adapter``, ``lora-diff``, ``merge-lora``) call, no
Gradio. An adapter goes through the first two modules before any engine loads it; the others build
on them:

* :mod:`g4v.lora.folders`: where adapters may come from (the adapter folders, names and paths
  resolved inside them, links refused) and which base model each one names.
* :mod:`g4v.lora.checks`: the checks a LoRA folder passes (config, rank, targets, every tensor's
  shape against the model's own layout), each problem one line; the checked ``AdapterSpec``.
* :mod:`g4v.lora.activation`: registering a checked adapter with an engine, and on a checkpoint
  with a vision LoRA which kind it is (replaces the vision LoRA, or runs on the vision model);
* :mod:`g4v.lora.choices`: the adapters a tab offers, and which base each was made for.

These four are the adapter handling every engine user of an adapter shares (Chat, LoRA, Evaluate):
other panels may import them. The LoRA panel's own work:

* :mod:`g4v.lora.settings`: what a token diff is asked (:class:`~g4v.lora.settings.LoraDiffSettings`,
  the one place for its defaults: ``lora-diff``'s flags, the tab's pickers and slider).
* :mod:`g4v.lora.side_by_side`: two models' answers streamed side by side.
* :mod:`g4v.lora.token_diff`: where the adapter's answer departs from the base's, token by token
  (transformers engine only: it needs logits).
* :mod:`g4v.lora.merge`: ``W += scaling * B @ A`` written as a full float32 checkpoint.
"""
