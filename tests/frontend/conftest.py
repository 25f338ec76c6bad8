"""Fixtures of the frontend tests: the built-in frontend and a small HF folder made on the fly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from ninfer_jax.frontend import ChatFrontend, Tokenizer

LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'system' %}<<SYS>>{{ m.content }}<</SYS>>"
    "{% elif m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}"
    "{% else %}{{ raise_exception('unsupported role ' ~ m.role) }}{% endif %}{% endfor %}"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather of a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.builtin()


@pytest.fixture(scope="session")
def frontend(tokenizer) -> ChatFrontend:
    return ChatFrontend(tokenizer)


def make_hf_folder(folder: Path, *, template: str | None = LLAMA2_TEMPLATE, template_file: str | None = None,
                   generation_eos: object = None) -> Path:
    """A tiny byte-level BPE with `<s>`, `</s>`, `[INST]`, `[/INST]`, `<<SYS>>`, `<</SYS>>` added."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["hello world, how are you today?", "the weather in paris is sunny", "tell me a story about the sea"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>")])
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "pad_token": None}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template_file is not None:
        (folder / "chat_template.jinja").write_text(template_file)
    if generation_eos is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return folder


@pytest.fixture
def hf_folder(tmp_path) -> Path:
    return make_hf_folder(tmp_path / "hf")


@pytest.fixture
def hf_folder_factory():
    return make_hf_folder
