"""Structured output: a request's grammar, checked at submission and walked token by token.

The grammar engine is llguidance (pinned in requirements.txt): a maintained Rust library
(guidance-ai, used by vLLM, SGLang and llama.cpp) with one abi3 wheel for every Python this
project runs on and no torch dependency; it compiles JSON Schema, regular expressions and Lark
grammars against the model's own vocabulary and computes one token mask per step in tens of
microseconds. XGrammar was the other candidate; docs/http.md says why this one.

`StructuredOutput` names what a request's output must match (a JSON object, a JSON Schema, a
regex, one of several strings, a Lark grammar). `Grammars` (one per engine) builds the
llguidance tokenizer of the model's vocabulary once and turns a `StructuredOutput` into a
`Matcher`, refusing a grammar that does not compile with a `RequestError` before the request is
queued. A `Matcher` gives the row's allowed tokens (`allowed`), follows each emitted token
(`consume`) and takes back tokens that were chosen but not emitted (`rollback`, a speculative
Verify unit cut by a stop): its state is exactly the request's committed output, which pauses
(Snapshot or Replay) never change, so it needs nothing on a pause.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ninfer_jax.errors import RequestError
from ninfer_jax.model import token_mask

KINDS = ("json_object", "json_schema", "regex", "choice", "lark", "tool_calls")
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
# JSON on one line as json.dumps writes it (`, ` and `: `, no other whitespace): what OpenAI's
# structured outputs return, and a model cannot pad an answer with whitespace forever. A schema's
# own "x-guidance" options override it.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_FIELD = "sampling.structured_output"
COMPILED_KEPT = 64  # compiled grammars an engine keeps for reuse (least recently used out first)


@dataclasses.dataclass(frozen=True)
class StructuredOutput:
    """What the output must match. `spec`: json_schema a schema (dict, or its JSON text); regex
    the pattern; choice the strings (one of them is the whole output); lark the grammar; none
    for json_object (any JSON object); tool_calls `{"tools": [chat tools], "name": str | None}`:
    one call of the named function, or (no name) one or more calls of any of the tools, in the
    Hermes / Qwen form the output parser reads, the arguments held to each tool's parameters."""

    kind: str
    spec: Any = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise RequestError(f"{_FIELD}.kind: must be one of {KINDS}, got {self.kind!r}")
        spec = self.spec
        if self.kind == "json_schema":
            if isinstance(spec, str):
                try:
                    spec = json.loads(spec)
                except json.JSONDecodeError as e:
                    raise RequestError(f"{_FIELD}.spec: the schema is not JSON ({e})") from None
            if not isinstance(spec, dict):
                raise RequestError(f"{_FIELD}.spec: a JSON schema must be an object, got {type(spec).__name__}")
            object.__setattr__(self, "spec", json.dumps(spec, sort_keys=True))  # hashable, canonical
        elif self.kind in ("regex", "lark"):
            if not isinstance(spec, str) or not spec:
                raise RequestError(f"{_FIELD}.spec: a {self.kind} must be a non-empty string")
        elif self.kind == "choice":
            if isinstance(spec, str) or not isinstance(spec, (list, tuple)) or not spec \
                    or any(not isinstance(c, str) or not c for c in spec):
                raise RequestError(f"{_FIELD}.spec: choices must be a non-empty list of non-empty strings")
            object.__setattr__(self, "spec", tuple(spec))
        elif self.kind == "tool_calls":
            object.__setattr__(self, "spec", _tool_spec(spec))
        elif spec is not None:
            raise RequestError(f"{_FIELD}.spec: json_object takes no spec")

    def grammar(self, added: Mapping[str, int] | None = None, tool_call_form: str = "json") -> str:
        """The llguidance grammar text. `added`: the tokenizer's added tokens by text (a tool
        call's markers are matched as those tokens where the tokenizer has them);
        `tool_call_form`: how the model's template writes a call (`tool_call_form_of`)."""
        import llguidance as llg

        if self.kind == "tool_calls":
            lark = (_xml_tool_calls_lark if tool_call_form == "xml" else _tool_calls_lark)
            return llg.LLMatcher.grammar_from_lark(lark(json.loads(self.spec), added or {}))
        if self.kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
        if self.kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(self.spec, defaults=JSON_LAYOUT)
        if self.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":  # Lark string literals: JSON's escapes are Lark's
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.spec))
        return llg.LLMatcher.grammar_from_lark(self.spec)


def _tool_spec(spec) -> str:
    """The canonical JSON of a tool_calls spec, checked: the tools' names and parameters, the name.
    `spec["tools"]`: chat tools, or (the canonical form, also as JSON text) {name: parameters}."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise RequestError(f"{_FIELD}.spec: not JSON ({e})") from None
    if isinstance(spec, dict) and isinstance(spec.get("tools"), dict):
        spec = dict(spec, tools=[{"name": n, "parameters": p} for n, p in spec["tools"].items()])
    if not isinstance(spec, dict) or not isinstance(spec.get("tools"), (list, tuple)) or not spec["tools"]:
        raise RequestError(f"{_FIELD}.spec: tool_calls needs a non-empty list of tools")
    tools = {}
    for k, tool in enumerate(spec["tools"]):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError(f"{_FIELD}.spec: tools[{k}] has no function name")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise RequestError(f"{_FIELD}.spec: tools[{k}].parameters must be a JSON schema object")
        tools[name] = params
    name = spec.get("name")
    if name is not None and name not in tools:
        raise RequestError(f"{_FIELD}.spec: the named function {name!r} is not among the tools")
    return json.dumps({"tools": tools, "name": name}, sort_keys=True)


def _tool_calls_lark(spec: dict, added: Mapping[str, int]) -> str:
    """Lark: '<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>', once for a named
    function, else one or more (a newline apart); ARGS held to the tool's parameters (%json)."""
    def marker(text: str) -> str:
        return f"<[{added[text]}]>" if text in added else json.dumps(text)

    names = [spec["name"]] if spec["name"] is not None else sorted(spec["tools"])
    rules = []
    for i, name in enumerate(names):
        head = json.dumps("\n{" + f'"name": {json.dumps(name)}, "arguments": ')
        rules.append(f"call{i}: {marker(TOOL_CALL_OPEN)} {head} args{i} " + json.dumps("}\n")
                     + f" {marker(TOOL_CALL_CLOSE)}")
        schema = dict(spec["tools"][name])
        schema["x-guidance"] = {**JSON_LAYOUT, **schema.get("x-guidance", {})}
        rules.append(f"args{i}: %json {json.dumps(schema)}")
    call = " | ".join(f"call{i}" for i in range(len(names)))
    start = "start: call" if spec["name"] is not None else 'start: call ("\\n" call)*'
    return "\n".join([start, f"call: {call}", *rules])


def tool_call_form_of(chat_template: str | None) -> str:
    """"xml" for a template that writes calls as `<function=NAME>` / `<parameter=KEY>` blocks
    (Qwen3.5, Qwen3-Coder), else "json" (Hermes / Qwen3: `{"name": ..., "arguments": ...}`)."""
    return "xml" if chat_template and "<function=" in chat_template and "<parameter=" in chat_template else "json"


_PARAM_CLOSE = "\n</parameter>\n"


def _xml_value(schema: dict, name: str) -> tuple[str, str]:
    r"""(rule body, extra rule) of one XML parameter's value and its close (`\n</parameter>\n`).
    A string is free text without `<`, one regular expression with the close (a separate close
    after it would be eaten by the text's own newlines); a number or boolean is spelt as JSON
    spells it; anything else is JSON held to its schema: what the output parser reads back."""
    close = json.dumps(_PARAM_CLOSE)
    kind = schema.get("type")
    if kind == "string" and not ({"enum", "const", "pattern", "format"} & set(schema)):
        return r"/[^<]+\n<\/parameter>\n/", ""
    if kind == "integer" and set(schema) <= {"type", "description", "title"}:
        return f"/-?(0|[1-9][0-9]*)/ {close}", ""
    if kind == "boolean":
        return f'("true" | "false") {close}', ""
    schema = dict(schema, **{"x-guidance": {**JSON_LAYOUT, **schema.get("x-guidance", {})}})
    return f"{name} {close}", f"{name}: %json {json.dumps(schema)}"


def _xml_tool_calls_lark(spec: dict, added: Mapping[str, int]) -> str:
    r"""Lark for the XML form: `<tool_call>\n<function=NAME>\n`, then each of the tool's
    parameters in its schema's order (`<parameter=KEY>\nVALUE\n</parameter>\n`; the required
    ones always, the others optional), then `</function>\n</tool_call>`; calls a newline apart."""
    def marker(text: str) -> str:
        return f"<[{added[text]}]>" if text in added else json.dumps(text)

    names = [spec["name"]] if spec["name"] is not None else sorted(spec["tools"])
    rules = []
    for i, name in enumerate(names):
        schema = spec["tools"][name]
        required = set(schema.get("required", ()))
        parts = []
        for k, (key, sub) in enumerate((schema.get("properties") or {}).items()):
            body, extra = _xml_value(sub if isinstance(sub, dict) else {}, f"value{i}_{k}")
            if extra:
                rules.append(extra)
            part = f"{json.dumps(f'<parameter={key}>' + chr(10))} {body}"
            parts.append(part if key in required else f"({part})?")
        head = json.dumps(f"\n<function={name}>\n")
        rules.append(f"call{i}: {marker(TOOL_CALL_OPEN)} {head} {' '.join(parts)} "
                     + json.dumps("</function>\n") + f" {marker(TOOL_CALL_CLOSE)}")
    call = " | ".join(f"call{i}" for i in range(len(names)))
    start = "start: call" if spec["name"] is not None else 'start: call ("\\n" call)*'
    return "\n".join([start, f"call: {call}", *rules])


class Matcher:
    """One request's walk through its grammar (an llguidance LLMatcher)."""

    def __init__(self, matcher, vocab_size: int):
        self._m = matcher
        self._vocab = vocab_size

    def bitmask(self) -> np.ndarray:
        """The tokens the grammar allows next (EOS only once it is complete) as the model's
        `token_mask.words(V)` uint32 words: what the compiled mask step applies."""
        return token_mask.fit(np.frombuffer(self._m.compute_bitmask(), "<u4"), self._vocab)

    def allowed(self) -> np.ndarray:
        """`[V]` bool: `bitmask` unpacked on the host."""
        return token_mask.allowed(self.bitmask(), self._vocab)

    def consume(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}: {self._m.get_error()}")

    def rollback(self, n: int) -> None:
        if n and not self._m.rollback(n):
            raise RuntimeError(f"the grammar could not take back {n} tokens: {self._m.get_error()}")

    def accepting(self) -> bool:
        return self._m.is_accepting()


class Grammars:
    """The grammar compiler of one engine: the llguidance tokenizer of its model's vocabulary
    (`tokenizer_json`: the tokenizers library's JSON; `vocab_size`: the model's, which may pad
    past the tokenizer's), built on first use."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int],
                 added: Mapping[str, int] | None = None, tool_call_form: str = "json"):
        self._json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._added = dict(added or {})  # the tokenizer's added tokens by text
        self.tool_call_form = tool_call_form  # how the model's chat template writes a tool call
        self._tokenizer = None
        # Compiled grammars by spec, never advanced: a request copies one (microseconds) instead
        # of compiling it again (milliseconds) — n choices, retries, an agent's every turn.
        self._compiled: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (a copy of a cached one is not counted)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            import llguidance as llg

            self._tokenizer = llg.LLTokenizer(self._json, n_vocab=self.vocab_size, eos_token=self._eos)
        return self._tokenizer

    def clear(self) -> None:
        """Forget the compiled grammars (the next request of each compiles it again)."""
        with self._lock:
            self._compiled.clear()

    def matcher(self, spec: StructuredOutput) -> Matcher:
        """A fresh matcher of `spec`; RequestError naming the field when it does not compile."""
        import llguidance as llg

        with self._lock:
            pristine = self._compiled.get(spec)
            if pristine is not None:
                self._compiled.move_to_end(spec)
                return Matcher(pristine.deep_copy(), self.vocab_size)
        m = llg.LLMatcher(self.tokenizer, spec.grammar(self._added, self.tool_call_form), log_level=0)  # compiles once
        if m.is_error():  # the constructor never raises: a grammar that does not compile is an error state
            raise RequestError(f"{_FIELD}: the {spec.kind} does not compile: {m.get_error().splitlines()[0]}")
        with self._lock:
            self.compiled += 1
            self._compiled[spec] = m
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return Matcher(m.deep_copy(), self.vocab_size)
