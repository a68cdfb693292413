"""Circuits: where the language model reads the picture (attention from a text token to every image
token, per layer and head) and what blocking that reading changes (attention knockout).

:mod:`g4v.circuits.attention` and :mod:`g4v.circuits.knockout` are the work, ``python -m g4v
circuits attention|knockout`` (:mod:`g4v.commands.circuits`) the command-line twin.
"""
