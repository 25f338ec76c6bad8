#!/usr/bin/env python
"""Make the byte-level BPE tokenizer of `builtin:tiny-hybrid`, deterministically.

The training text is the training split of the English corpus that ships with Python
(`ninfer_jax.train.corpus`, the text `scripts/train_builtin.py` trains the model on; nothing is
downloaded), or with `--corpus generated` text generated here from fixed word lists and a fixed
seed. The result has exactly 1024 tokens: 256 byte tokens, 752 merges and 16 added tokens
(ChatML-style) at ids 1008..1023. It writes `tokenizer.json`, `tokenizer_config.json` and
`generation_config.json` into `ninfer_jax/builtin_model/` (or `--out`); the chat template there
(`chat_template.jinja`) is written by hand.

    python scripts/make_builtin_tokenizer.py [--out DIR] [--corpus stdlib|generated]

Pinned to `tokenizers==0.23.3`; tests/frontend checks that a rerun is byte-identical.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 1024
# (content, special): `special` tokens are dropped by decode(skip_special_tokens=True); the
# reasoning and tool tags are added tokens that stay in decoded text, as in Qwen3 tokenizers.
ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
) + tuple((f"<|reserved_{i}|>", True) for i in range(7))
BPE_SIZE = VOCAB_SIZE - len(ADDED_TOKENS)  # bytes + merges
SEED = 1024

WORDS = (
    "the of and to in is that it for you was with on as have be at this are not by from or but what "
    "all were when we there can an your which their said if do will each about how up out them then "
    "she many some so these would other into has more her two like him see time could no make than "
    "first been its who now people my made over did down only way find use may water long little very "
    "after words called just where most know get through back much go good new write our me man too "
    "any day same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off went old "
    "number great tell men say small every found still between name should home big give air line set "
    "own under read last never us left end along while might next sound below saw something thought "
    "both few those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without once life enough took sometimes "
    "four head above kind began almost live page got earth need far hand high year mother light "
    "country father let night following picture being study second eyes soon times story since white "
    "days ever paper hard near sentence better best across during today others sure means knew try "
    "told young sun ways thing whole hear example heard several change answer room sea against top "
    "turned learn point city play toward five using himself usually hello please thanks question "
    "weather search file result error value function call tool user assistant system message model "
    "cache token context request response input output reasoning step plan check list data query"
).split()
NAMES = ("get_weather", "search", "read_file", "write_file", "run_code", "calculator", "lookup",
         "send_email", "list_files", "get_time")
ARG_KEYS = ("city", "query", "path", "text", "unit", "limit", "code", "expression", "to", "zone")
CODE = (
    "def {f}({a}):\n    return {a} + 1\n",
    "for i in range({n}):\n    print(i)\n",
    "if x > {n}:\n    x = x - 1\nelse:\n    x = 0\n",
    "import json\ndata = json.loads(text)\n",
    "class {F}:\n    def __init__(self):\n        self.value = {n}\n",
)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
    return " ".join(words).capitalize() + rng.choice(".?!.,;:")


def _tool_definition(rng: random.Random, name: str) -> str:
    keys = rng.sample(ARG_KEYS, rng.randint(1, 3))
    return json.dumps({"type": "function", "function": {
        "name": name, "description": _sentence(rng),
        "parameters": {"type": "object", "properties": {k: {"type": rng.choice(["string", "number"])} for k in keys},
                       "required": keys[:1]}}})


def _tool_call(rng: random.Random, name: str) -> str:
    args = {k: rng.choice([rng.choice(WORDS), rng.randint(0, 999)]) for k in rng.sample(ARG_KEYS, rng.randint(1, 3))}
    return json.dumps({"name": name, "arguments": args})


def corpus() -> list[str]:
    """Deterministic training text: prose, chat turns, tool definitions/calls, code, numbers."""
    rng = random.Random(SEED)
    lines: list[str] = []
    for _ in range(4000):
        lines.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 4))))
    for _ in range(600):
        name = rng.choice(NAMES)
        lines.append(_tool_definition(rng, name))
        lines.append("\n" + _tool_call(rng, name) + "\n")
        lines.append("\n" + json.dumps({rng.choice(ARG_KEYS): rng.choice(WORDS), "ok": rng.random() < 0.5}) + "\n")
    for _ in range(600):
        lines.append(rng.choice(CODE).format(f=rng.choice(NAMES), F=rng.choice(WORDS).capitalize(),
                                             a=rng.choice(ARG_KEYS), n=rng.randint(0, 100)))
    for _ in range(400):
        lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(2, 8))))
    lines.append("# Tools\n\nYou may call one or more functions. Function signatures:\n")
    lines.append("To call a function, reply with:\n")
    return lines


def stdlib_corpus() -> list[str]:
    """The training documents of `ninfer_jax.train.corpus` (deterministic per Python install)."""
    from ninfer_jax.train import corpus as stdlib

    return [d.text for d in stdlib.load().train]


CORPORA = {"generated": corpus, "stdlib": stdlib_corpus}


def build(texts: list[str] | None = None) -> Tokenizer:
    """The tokenizer trained on `texts` (default: the generated corpus above)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(corpus() if texts is None else texts, trainer)
    if tok.get_vocab_size() != BPE_SIZE:
        raise SystemExit(f"training gave {tok.get_vocab_size()} tokens, wanted {BPE_SIZE}")
    for content, special in ADDED_TOKENS:  # one at a time, so ids follow the listed order
        added = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise SystemExit(f"vocabulary has {tok.get_vocab_size(with_added_tokens=True)} tokens, wanted {VOCAB_SIZE}")
    return tok


def write(out: Path, texts: list[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build(texts)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    ids = {content: tok.token_to_id(content) for content, _ in ADDED_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(ids[content]): {"content": content, "special": special, "normalized": False,
                                "lstrip": False, "rstrip": False, "single_word": False}
            for content, special in ADDED_TOKENS
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    generation = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    default = Path(__file__).resolve().parent.parent / "ninfer_jax" / "builtin_model"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default, help="output folder")
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="stdlib",
                        help="training text: the stdlib corpus (the shipped tokenizer) or the generated word lists")
    args = parser.parse_args()
    write(args.out, None if args.corpus == "generated" else CORPORA[args.corpus]())


if __name__ == "__main__":
    main()
