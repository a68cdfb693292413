"""Why did the model say that: per-level attribution of an answer token to the image tokens, a
faithfulness check of that attribution, and a logit lens on the image positions.

Granite 4 Vision adds its visual features at 8 levels (:mod:`g4v.model.levels`). The question a
model developer asks after the Deepstack inspector is *which image regions, through which levels,
an answer token relied on* and whether that picture can be trusted. The package reads from the
bottom up; each module imports only those above it:

* :mod:`g4v.attribution.forward`: the image encoded once, the answer to explain, and forward passes
  of the language model with given injected features (batched, no vision tower rerun);
* :mod:`g4v.attribution.gradients`: gradient x input (one backward pass) and integrated gradients
  (Captum) on each level's injected features;
* :mod:`g4v.attribution.deletion`: the deletion test: zero the top-k% tokens by attribution vs
  random k%, and the area between the curves;
* :mod:`g4v.attribution.lens`: the logit lens at image positions, per layer and per level;
* :mod:`g4v.attribution.run`: one request end to end, for the CLI and the app's tab;
* :mod:`g4v.attribution.pointing`: the pointing game on the trained demo checkpoint;
* :mod:`g4v.attribution.bench`: what gradient x input costs against a plain forward pass.
"""
