"""Chat templates run in an immutable sandbox; a hostile template gets a typed TemplateError."""
from __future__ import annotations

import pytest

from ninfer_jax.frontend import ChatFrontend, ChatTemplate, FrontendError, TemplateError

MESSAGES = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "class_mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "macro_internals": "{% macro m() %}{% endmacro %}{{ m._environment }}",
    "globals_via_cycler": "{{ cycler.__init__.__globals__['os'].system('echo pwned') }}",
    "globals_via_namespace": "{{ namespace.__init__.__globals__ }}",
    "raise_exception_globals": "{{ raise_exception.__globals__['json'] }}",
    "format_escape": "{{ '{0.__class__.__base__.__subclasses__}'.format('') }}",
    "format_map_escape": "{{ '{x.__class__}'.format_map({'x': 1}) }}",
    "mutate_messages": "{{ messages.append({'role': 'system', 'content': 'x'}) }}",
    "mutate_message_dict": "{{ messages[0].update({'content': 'x'}) }}",
    "mutate_via_pop": "{{ messages.pop() }}",
    "include_file": "{% include '/etc/passwd' %}",
    "import_file": "{% import '/etc/passwd' as x %}{{ x }}",
    "extends_file": "{% extends '/etc/hostname' %}",
    "func_code": "{{ raise_exception.__code__ }}",
    "self_reference": "{{ self._TemplateReference__context.environment }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_cannot_reach_python_internals_or_files(name, tokenizer):
    front = ChatFrontend(tokenizer, HOSTILE[name])
    with pytest.raises(TemplateError):
        front.render_chat(MESSAGES)


def test_hostile_template_gets_no_file_content_and_messages_stay_unchanged(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    for source in ("{% include '/etc/passwd' %}", "{{ messages.clear() }}"):
        with pytest.raises(TemplateError) as info:
            ChatFrontend(tokenizer, source).render_chat(messages)
        assert "root:" not in str(info.value)
    assert messages == [{"role": "user", "content": "hi"}]


def test_template_output_is_capped(tokenizer):
    source = "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}"
    front = ChatFrontend(tokenizer, source, max_template_output_chars=10_000)
    with pytest.raises(TemplateError, match="exceeds"):
        front.render_chat(MESSAGES)


def test_template_errors_are_typed(tokenizer):
    with pytest.raises(TemplateError, match="compile"):
        ChatTemplate("{% for x in %}")
    with pytest.raises(TemplateError, match="alternate"):
        ChatFrontend(tokenizer, "{{ raise_exception('roles must alternate') }}").render_chat(MESSAGES)
    with pytest.raises(TemplateError):
        ChatFrontend(tokenizer, "{{ 1 / 0 }}").render_chat(MESSAGES)
    with pytest.raises(TemplateError):
        ChatFrontend(tokenizer, "{{ messages[5].content.x.y }}").render_chat(MESSAGES)
    assert issubclass(TemplateError, FrontendError)


def test_hf_template_features_work_in_the_sandbox(tokenizer):
    source = (
        "{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- if m.role == 'system' %}{% continue %}{% endif -%}"
        "{%- set ns.n = ns.n + 1 -%}{{ m.content | tojson }}{%- endfor -%}|{{ ns.n }}|{{ tools | tojson(indent=2) }}"
        "|{{ strftime_now('%Y') | length }}|{{ bos_token }}{{ eos_token }}"
    )
    out = ChatFrontend(tokenizer, source).render_chat(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "é"}],
        tools=[{"type": "function", "function": {"name": "f"}}], add_generation_prompt=False)
    assert out.text.startswith('"é"|1|[\n  {') and out.text.endswith("|4|<|im_end|>")


def test_missing_template_is_a_typed_error(hf_folder_factory, tmp_path):
    from ninfer_jax.frontend import Tokenizer
    tok = Tokenizer.from_folder(hf_folder_factory(tmp_path / "hf", template=None))
    with pytest.raises(TemplateError, match="no chat template"):
        ChatFrontend(tok).render_chat(MESSAGES)
