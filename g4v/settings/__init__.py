"""Settings written once: each a dataclass whose fields carry their defaults, help and environment
variables, from which the flags and the environment's values are derived.

* :mod:`g4v.settings.flags`: one command-line flag per field of a settings dataclass (every
  command's, the demo's trainers', the app's), an environment variable per field where it declares one;
* :mod:`g4v.settings.limits`: the bounds on what visitors and commands may send (pictures, PDFs,
  uploads, sessions), read from ``G4V_*`` once, when first asked, never at import.
"""
