"""Tokenizer loading: the built-in 1024-token BPE and any Hugging Face folder."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from ninfer_jax.frontend import Tokenizer, TokenizerLoadError


REPO = Path(__file__).resolve().parents[2]
BUILTIN = REPO / "ninfer_jax" / "builtin_model"

EXPECTED_ADDED = {
    "<|endoftext|>": 1008, "<|im_start|>": 1009, "<|im_end|>": 1010, "<think>": 1011, "</think>": 1012,
    "<tool_call>": 1013, "</tool_call>": 1014, "<tool_response>": 1015, "</tool_response>": 1016,
    **{f"<|reserved_{i}|>": 1017 + i for i in range(7)},
}


def test_builtin_vocabulary_is_exactly_1024_with_chatml_specials(tokenizer):
    assert tokenizer.vocab_size == 1024
    assert tokenizer.special_tokens == EXPECTED_ADDED
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 1010
    assert tokenizer.eos_token_ids == (1010, 1008)
    assert tokenizer.pad_token_id == 1008 and tokenizer.bos_token_id is None
    # `<think>` / tool tags are added tokens kept by decode, like Qwen3's.
    assert tokenizer.special_token_ids == frozenset({1008, 1009, 1010, *range(1017, 1024)})
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


def test_builtin_round_trip_and_special_tokens_in_text(tokenizer):
    text = "<|im_start|>user\nHello world, what is the weather? 42 é 中文<|im_end|>\n<think>\nok\n</think>"
    ids = tokenizer.encode(text)
    assert ids[0] == 1009 and 1010 in ids and 1011 in ids and 1012 in ids
    assert tokenizer.decode(ids) == text
    assert "<|im_start|>" not in tokenizer.decode(ids, skip_special_tokens=True)
    assert "<think>" in tokenizer.decode(ids, skip_special_tokens=True)
    assert all(0 <= i < 1024 for i in ids)


def test_builtin_files_are_small_and_script_regenerates_them_byte_identical(tmp_path):
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")
    assert sum((BUILTIN / name).stat().st_size for name in tokenizer_files) < 200_000
    assert (BUILTIN / "model.safetensors").stat().st_size < 4 << 20  # "a few MB at most" (issue 16)
    spec = importlib.util.spec_from_file_location("make_builtin_tokenizer", REPO / "scripts" / "make_builtin_tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The shipped tokenizer is the recipe trained on the stdlib corpus of the Python that trained
    # the model (metrics.json names it by digest); another Python's docstrings are other text.
    from ninfer_jax.model import builtin
    from ninfer_jax.train import corpus

    recorded = builtin.trained_metrics()["corpus"]
    here = corpus.load()
    if here.digest != recorded["sha256"]:
        pytest.skip(f"this Python's stdlib corpus ({here.digest[:12]}) is not the one the built-in model was "
                    f"trained on ({recorded['sha256'][:12]}, Python {recorded['python']})")
    module.write(tmp_path, [d.text for d in here.train])
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        made = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        shipped = hashlib.sha256((BUILTIN / name).read_bytes()).hexdigest()
        assert made == shipped, name


def test_load_hf_folder_with_specials_template_and_eos(hf_folder):
    tok = Tokenizer.from_folder(hf_folder)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert tok.eos_token_ids == (tok.token_to_id("</s>"),)
    assert {"<s>", "</s>", "[INST]", "[/INST]"} <= set(tok.special_tokens)
    assert "[INST]" in tok.chat_template
    ids = tok.encode("<s>[INST] hello world [/INST]")
    assert ids[0] == tok.bos_token_id and tok.token_to_id("[/INST]") in ids
    assert tok.decode(ids, skip_special_tokens=True).strip() == "hello world"


def test_load_hf_folder_generation_eos_and_template_file_precedence(tmp_path, hf_folder_factory):
    folder = hf_folder_factory(tmp_path / "hf", template_file="{{ 'from file' }}", generation_eos=[0, 1])
    tok = Tokenizer.from_folder(folder)
    assert tok.chat_template == "{{ 'from file' }}"
    assert tok.eos_token_ids[0] == tok.eos_token_id and tok.eos_token_ids[1:] == (0, 1)


def test_load_hf_folder_named_templates(tmp_path, hf_folder_factory):
    folder = hf_folder_factory(tmp_path / "hf", template=None)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_folder(folder)
    assert tok.chat_template == "A" and tok.named_chat_templates == {"default": "A", "tool_use": "B"}


def test_load_errors_are_typed(tmp_path, hf_folder_factory):
    with pytest.raises(TokenizerLoadError):
        Tokenizer.from_folder(tmp_path)  # no tokenizer.json
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError):
        Tokenizer.from_folder(tmp_path)
    folder = hf_folder_factory(tmp_path / "hf")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(TokenizerLoadError, match="not in the vocabulary"):
        Tokenizer.from_folder(folder)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizerLoadError):
        Tokenizer.from_folder(folder)


def test_load_by_name(tokenizer):
    assert Tokenizer.load("builtin:tiny-hybrid").fingerprint == tokenizer.fingerprint
