"""The lent GPU machine's missing packages, for the GPU check's smoke run.

``machine.environment()`` (beside this file) puts this folder first on ``PYTHONPATH`` and names, in
``G4V_UNIMPORTABLE``, the packages the workbench needs that the machine neither has nor gets
carried to it (``requirements-gpu-check.txt``). Python imports this file at start-up; each named
package then fails to import, and ``importlib.util.find_spec`` says it is absent, as it would
there (transformers asks find_spec before it uses an optional library such as torchao). Names are
requirement names; each of today's three (gradio, captum, torchao) is also its import name.
"""

import os
import sys

for _name in filter(None, os.environ.get("G4V_UNIMPORTABLE", "").split(",")):
    sys.modules[_name] = None  # an import of it fails; find_spec returns None
