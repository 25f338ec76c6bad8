"""`--chat_template=FILE` (issue 37): its jinja text replaces the tokenizer's chat template for chat,
serve and the engine; a file that cannot serve is refused at the boundary (exit 2, one line, before
any model loads: the `ninfer` fixture fails the test if one does). Also the other `ninfer serve`
inputs read before the model: a bad generation_config.json default, a --request_log path."""
import json

import pytest

from cli_runner import run_cli
from ninfer_jax import Engine, EngineConfig, SamplingParams
from ninfer_jax.engine.preflight import preflight
from ninfer_jax.frontend import Tokenizer
from ninfer_jax.sim import SimProgram

TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
HI = [{"role": "user", "content": "hi"}]


def _refused(result, command: str, needle: str) -> str:
    code, out, err = result
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ninfer {command}: ") and needle in lines[0], lines[0]
    assert "Traceback" not in err and "[ninfer] loading" not in err and out == ""
    return lines[0]


@pytest.fixture
def bad_templates(tmp_path):
    (tmp_path / "latin1.jinja").write_bytes("{{ 'caf\xe9' }}".encode("latin-1"))
    (tmp_path / "syntax.jinja").write_text("{% for m in messages %}{{ m.content }\n{% endfor %}")
    (tmp_path / "empty.jinja").write_text("  \n")
    return {"missing": (str(tmp_path / "nope.jinja"), "nope.jinja: no such file"),
            "latin1": (str(tmp_path / "latin1.jinja"), "latin1.jinja: not UTF-8 text (invalid continuation byte"),
            "syntax": (str(tmp_path / "syntax.jinja"), "syntax.jinja: chat template does not compile:"),
            "empty": (str(tmp_path / "empty.jinja"), "empty.jinja: the file is empty")}


@pytest.mark.parametrize("kind", ["missing", "latin1", "syntax", "empty"])
@pytest.mark.parametrize("command, args", [
    ("chat", ["--prompt=hi"]),
    ("generate", ["--token_ids=1,2,3"]),  # no tokenizer needed for the prompt: the file is still checked
    ("serve", ["--port=0"]),
    ("serve", ["--model=fake:tiny", "--port=0"]),
])
def test_a_template_file_that_cannot_serve_is_refused_before_the_model_loads(ninfer, bad_templates, kind, command,
                                                                           args):
    path, needle = bad_templates[kind]
    line = _refused(ninfer(command, f"--chat_template={path}", *args), command, "ConfigError: chat_template: ")
    assert needle in line


def test_a_bad_generation_config_default_is_refused_before_the_model_loads(ninfer, checkpoint):
    folder = checkpoint("ckpt")
    with open(f"{folder}/generation_config.json", "w") as f:
        json.dump({"temperature": 0.7, "top_p": 0}, f)
    _refused(ninfer("generate", f"--model={folder}", "--token_ids=1,2,3"), "generate",
             "ConfigError: generation_config.json: top_p: must lie in (0, 1], got 0")
    _refused(ninfer("serve", f"--model={folder}", "--port=0"), "serve", "ConfigError: generation_config.json: ")


def test_a_request_log_that_cannot_be_opened_is_refused_at_serve_start(ninfer, tmp_path):
    line = _refused(ninfer("serve", "--model=fake:tiny", "--port=-1", "--http_port=0",
                           f"--request_log={tmp_path / 'no' / 'such' / 'dir.jsonl'}"), "serve",
                    "UsageError: request_log: cannot open ")
    assert "No such file or directory" in line


def test_the_template_renders_chat_everywhere(tmp_path, monkeypatch, capsys):
    """The file's template renders the prompt in preflight, in the engine (chat) and in the fake
    engine `ninfer serve --model=fake:NAME` serves; `ninfer chat --chat_template` runs with it (on
    the cost-model Program: no model math)."""
    path = tmp_path / "plain.jinja"
    path.write_text(TEMPLATE)
    tok = Tokenizer.builtin()
    want = tok.encode("[user] hi\n[assistant] ")
    assert list(preflight(EngineConfig(), messages=HI).prompt_ids) != want  # the built-in template's
    cfg = EngineConfig(max_concurrency=1, max_context=256, progress=False, chat_template=str(path))
    assert list(preflight(cfg, messages=HI).prompt_ids) == want
    engine = Engine(cfg, program=SimProgram(cfg), start=False)
    try:
        assert engine.tokenizer.chat_template == TEMPLATE
        assert list(engine.chat(HI, sampling=SamplingParams(temperature=0, max_tokens=2)).prompt_token_ids) == want
    finally:
        engine.close()
    from server.fake_engine import FakeEngine

    fake = FakeEngine(chat_template=str(path))
    try:
        assert list(fake.chat_frontend().render_chat(HI).token_ids) == want
    finally:
        fake.close()
    # `ninfer chat` in process, its engine on the cost-model Program
    monkeypatch.setattr("ninfer_jax.Engine", lambda config: Engine(config, program=SimProgram(config)))
    code, out, err = run_cli(capsys, "chat", f"--chat_template={path}", "--prompt=hi", "--max_tokens=2",
                             "--max_concurrency=1", "--max_context=256")
    assert code == 0, err
    assert f"chat: {len(want)} prompt tokens" in err
