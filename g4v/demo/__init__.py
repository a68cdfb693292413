"""The bundled demo checkpoint: its builder (and, later, its training and evaluation)."""
