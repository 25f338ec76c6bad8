"""Tokenizer: a Hugging Face `tokenizers` model plus the facts the engine needs from its config.

Loads any Hugging Face tokenizer folder (`tokenizer.json`, optional `tokenizer_config.json`,
`chat_template.jinja` / `chat_template.json`, `generation_config.json`) or the built-in one
shipped with the built-in model in `ninfer_jax/builtin_model/` (made by
`scripts/make_builtin_tokenizer.py` from the stdlib corpus the model is trained on).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import tokenizers

from .byte_pieces import byte_pieces
from .errors import TokenizerLoadError

BUILTIN_PACKAGE = "ninfer_jax.builtin_model"  # the built-in model's own folder
BUILTIN_NAME = "builtin:tiny-hybrid"


def _token_content(value: Any) -> str | None:
    """`tokenizer_config.json` spells a token as a string or as a serialised AddedToken."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerLoadError(f"cannot read a token from {value!r}")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerLoadError(f"{path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path.name}: expected a JSON object")
    return data


@dataclass(frozen=True)
class SpecialToken:
    """One added token: its text, id, and whether decoding with skip_special_tokens drops it."""

    content: str
    id: int
    special: bool


class Tokenizer:
    """Encode/decode plus special ids, eos ids and the chat template(s) of one tokenizer."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        name: str = "",
        eos_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
        named_chat_templates: Mapping[str, str] | None = None,
    ):
        self._backend = backend
        self.name = name
        self.chat_template = chat_template
        self.named_chat_templates = dict(named_chat_templates or {})
        self._added = tuple(
            SpecialToken(tok.content, int(idx), bool(tok.special))
            for idx, tok in sorted(backend.get_added_tokens_decoder().items())
        )
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.pad_token = pad_token
        self.eos_token_id = self._id_or_none(eos_token, "eos_token")
        self.bos_token_id = self._id_or_none(bos_token, "bos_token")
        self.pad_token_id = self._id_or_none(pad_token, "pad_token")
        eos_ids: list[int] = [] if self.eos_token_id is None else [self.eos_token_id]
        for idx in extra_eos_token_ids:
            if not 0 <= int(idx) < self.vocab_size:
                raise TokenizerLoadError(f"eos token id {idx} outside the vocabulary")
            if int(idx) not in eos_ids:
                eos_ids.append(int(idx))
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        self.fingerprint = hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()
        self._pieces: tuple[bytes, ...] | None | bool = False  # byte_pieces(), built on first use

    def _id_or_none(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        idx = self._backend.token_to_id(token)
        if idx is None:
            raise TokenizerLoadError(f"{what} {token!r} is not in the vocabulary")
        return int(idx)

    # --- loading -----------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> "Tokenizer":
        folder = Path(folder)
        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerLoadError(f"{folder}: no tokenizer.json")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise TokenizerLoadError(f"{tok_file}: {exc}") from exc
        config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        template, named = cls._read_templates(folder, config)
        extra_eos: list[int] = []
        gen_file = folder / "generation_config.json"
        if gen_file.is_file():
            eos = _read_json(gen_file).get("eos_token_id")
            if isinstance(eos, int):
                extra_eos.append(eos)
            elif isinstance(eos, list) and all(isinstance(e, int) for e in eos):
                extra_eos.extend(eos)
            elif eos is not None:
                raise TokenizerLoadError(f"generation_config.json: bad eos_token_id {eos!r}")
        return cls(
            backend,
            name=str(folder),
            eos_token=_token_content(config.get("eos_token")),
            bos_token=_token_content(config.get("bos_token")),
            pad_token=_token_content(config.get("pad_token")),
            extra_eos_token_ids=extra_eos,
            chat_template=template,
            named_chat_templates=named,
        )

    @staticmethod
    def _read_templates(folder: Path, config: Mapping[str, Any]) -> tuple[str | None, dict[str, str]]:
        """`chat_template.jinja` wins over `chat_template.json`, which wins over the config field."""
        named: dict[str, str] = {}
        raw = config.get("chat_template")
        if (folder / "chat_template.json").is_file():
            raw = _read_json(folder / "chat_template.json").get("chat_template", raw)
        default: str | None = None
        if isinstance(raw, str):
            default = raw
        elif isinstance(raw, list):
            for entry in raw:
                if not (isinstance(entry, Mapping) and isinstance(entry.get("name"), str)
                        and isinstance(entry.get("template"), str)):
                    raise TokenizerLoadError(f"bad chat_template entry {entry!r}")
                named[entry["name"]] = entry["template"]
            default = named.get("default")
        elif raw is not None:
            raise TokenizerLoadError("chat_template must be a string or a list of named templates")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            try:
                default = jinja_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenizerLoadError(f"{jinja_file}: {exc}") from exc
        return default, named

    @classmethod
    def builtin(cls) -> "Tokenizer":
        """The tokenizer of `builtin:tiny-hybrid` (vocabulary of exactly 1024 tokens)."""
        with resources.as_file(resources.files(BUILTIN_PACKAGE)) as folder:
            tok = cls.from_folder(folder)
        tok.name = BUILTIN_NAME
        return tok

    @classmethod
    def load(cls, spec: str | Path) -> "Tokenizer":
        """`builtin:tiny-hybrid` or a folder path."""
        if str(spec) == BUILTIN_NAME:
            return cls.builtin()
        return cls.from_folder(spec)

    # --- facts -------------------------------------------------------------------------------
    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Total vocabulary including added (special) tokens."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @property
    def added_tokens(self) -> tuple[SpecialToken, ...]:
        return self._added

    @property
    def special_tokens(self) -> dict[str, int]:
        """Every added token (special or not, e.g. `<think>`) by its text."""
        return {t.content: t.id for t in self._added}

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids that `decode(..., skip_special_tokens=True)` drops."""
        return frozenset(t.id for t in self._added if t.special)

    def token_to_id(self, token: str) -> int | None:
        idx = self._backend.token_to_id(token)
        return None if idx is None else int(idx)

    def id_to_token(self, idx: int) -> str | None:
        return self._backend.id_to_token(int(idx))

    # --- encode / decode ---------------------------------------------------------------------
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; added tokens written in the text are matched as single ids.

        `add_special_tokens=False` is how a rendered chat template is encoded (the template
        already wrote any bos); raw prompts may ask for the post-processor's tokens.
        """
        if not isinstance(text, str):
            raise TypeError("encode() takes a str")
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def byte_pieces(self) -> tuple[bytes, ...] | None:
        """Per id, the bytes it adds to `decode(ids, skip_special_tokens=True)`, or None when
        this tokenizer's decoding is not a plain concatenation of bytes.

        A byte-level BPE decoder (GPT-2 / Qwen) maps every token to a fixed byte string and
        decodes the concatenation as UTF-8 with replacement; with this table a stream decodes
        each token in constant Python time (engine/detok.py) instead of two tokenizer calls.
        The table is checked against the tokenizer itself on sampled sequences that include
        every added token; any difference and it is not offered."""
        if self._pieces is False:
            self._pieces = byte_pieces(self._backend, self.special_token_ids)
        return self._pieces

    def __repr__(self) -> str:
        return f"Tokenizer({self.name or '?'}, vocab_size={self.vocab_size}, eos={self.eos_token_ids})"
