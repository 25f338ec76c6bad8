"""Training of the built-in hybrid model (`scripts/train_builtin.py`): an English corpus from the
Python installation (corpus.py), packed token windows (data.py), the optax/orbax loop
with the held-out metrics (loop.py), the Hugging Face folder export (export.py)."""
