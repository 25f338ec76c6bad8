"""Request bodies of the OpenAI-compatible HTTP API (pydantic), checked before anything runs.

Each model names the fields the API honours. Fields of the OpenAI API that this engine cannot
honour (`n` > 1, forced tool choice, `logit_bias`, a JSON `response_format`, `echo`, ...) are
refused with a 400 naming the field, never ignored; so are the fields of vLLM's server this one
does not serve (`openai_convert.UNSERVED`). Other unknown fields are ignored, as the field's
servers do (clients send vendor extensions).

Extensions (docs/http.md): `cache_markers` (SH-1..4, the wire form: non-negative indices),
`anchors` (REC-1 private anchors, same form), `session` (session affinity of sources); with
vLLM's meanings `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`,
`min_tokens`, `include_stop_str_in_output` and, on chat, `chat_template_kwargs`; on
completions, `recovery_point`, `anchors` and `markers` as token frontiers (Engine.submit's
explicit save points).
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """The sampling fields every generation endpoint shares (OpenAI names, then extensions)."""

    model: str = Field(min_length=1)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    n: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # extensions (vLLM's names and meanings)
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    min_tokens: Optional[int] = None
    include_stop_str_in_output: Optional[bool] = None
    prompt_logprobs: Optional[int] = None
    session: Optional[str] = None


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    response_format: Optional[dict[str, Any]] = None
    cache_markers: Optional[list[dict[str, Any]]] = None
    anchors: Optional[list[dict[str, Any]]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # passed to the template (enable_thinking, ...)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = None
    logprobs: Optional[int] = None
    echo: Optional[bool] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None
    # extensions: explicit save points of a pre-tokenised prompt (Engine.submit's)
    recovery_point: Optional[int] = None
    anchors: Optional[list[int]] = None
    markers: Optional[list[int]] = None


class ResponsesReasoning(_Body):
    effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh"]] = None
    summary: Optional[Literal["auto", "concise", "detailed"]] = None


class ResponsesRequest(_Body):
    """OpenAI's Responses body (server/responses_routes.py). `reasoning.effort` maps to the
    template's thinking switch where it has one; `metadata`, `include`, `user`, `store` and the
    other bookkeeping fields are accepted (echoed where the response object has them)."""

    model: str = Field(min_length=1)
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = Field(default=None, min_length=1)  # "" names no response
    store: bool = True
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stream: bool = False
    text: Optional[dict[str, Any]] = None
    truncation: Optional[Literal["auto", "disabled"]] = None
    reasoning: Optional[ResponsesReasoning] = None
    metadata: Optional[dict[str, str]] = None
    include: Optional[list[str]] = None
    background: Optional[bool] = None
    # extensions
    seed: Optional[int] = None
    top_k: Optional[int] = None
    cache_markers: Optional[list[dict[str, Any]]] = None
    session: Optional[str] = None


class TokenizeRequest(_Body):
    """vLLM's /tokenize: a prompt, or chat messages (and tools) rendered by the template."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[Any]] = None
    tools: Optional[list[dict]] = None


class DetokenizeRequest(_Body):
    model: Optional[str] = None
    tokens: list[int]
