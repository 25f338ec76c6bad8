"""Data files of the built-in tokenizer and chat template (made by scripts/make_builtin_tokenizer.py)."""
