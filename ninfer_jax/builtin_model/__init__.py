"""The trained built-in model as a Hugging Face folder (config.json with one MTP layer,
model.safetensors, the tokenizer retrained on the same text, the chat template, metrics.json),
made by `scripts/train_builtin.py`. It loads through the ordinary path,
`load_model(ninfer_jax.model.builtin.trained_folder())`; `builtin:tiny-hybrid` is still the
random-weight model until the tests that depend on its tokenizer are regenerated (issue 16)."""
