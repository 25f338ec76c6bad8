"""The built-in model, `builtin:tiny-hybrid`, as a Hugging Face folder (config.json with one MTP
layer, model.safetensors, the tokenizer trained on the same text, the chat template,
metrics.json), made by `scripts/train_builtin.py`. `load_model("builtin:tiny-hybrid")` reads it
through the ordinary loader."""
