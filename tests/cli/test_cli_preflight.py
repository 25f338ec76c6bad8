"""Bad input is refused before the model loads: exit 2, one line `ninfer COMMAND: ErrorClass: message`,
the engine's own typed error, no absl USAGE banner, no engine built (the `ninfer` fixture fails the
test if one is)."""
import pytest

from ninfer_jax import EngineConfig
from ninfer_jax.engine.preflight import preflight
from ninfer_jax.errors import CheckpointError, ConfigError, RequestError

LONG = "one two three four five six seven eight nine ten eleven twelve"


def _refused(result, command, line_start):
    code, out, err = result
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ninfer {command}: {line_start}"), lines[0]
    assert "USAGE" not in err and "Traceback" not in err and "[ninfer] loading" not in err
    assert out == ""
    return lines[0]


@pytest.mark.parametrize("args, line_start", [
    (["--temperature=1000"], "RequestError: sampling.temperature: must lie in [0, 100], got 1000.0"),
    (["--seed=-5"], "RequestError: sampling.seed: must be an int in [0, 2**63), got -5"),
    (["--max_tokens=0"], "RequestError: sampling.max_tokens: must be a positive int"),
    (["--token_ids=1,x,3"], "RequestError: prompt: --token_ids must be comma-separated integers, got '1,x,3'"),
    (["--token_ids=1,2,5000"], "RequestError: prompt: token id 5000 outside the vocabulary [0, 1024)"),
    (["--token_ids=-1"], "RequestError: prompt: token id -1 outside the vocabulary"),
    (["--token_ids="], "RequestError: prompt: empty"),
    (["--max_context=8", f"--prompt={LONG}"], "RequestError: prompt: "),
    (["--max_context=8", "--token_ids=1,2,3,4,5,6,7,8"],
     "RequestError: prompt: 8 tokens leave no room to generate within max_context=8"),
    (["--max_concurrency=9"], "ConfigError: max_concurrency: C must be an int in [1, 8]"),
    (["--max_context=1"], "ConfigError: max_context: must be an int >= 2"),
    (["--chunk_size=0"], "ConfigError: chunk_size: "),
    (["--kv_capacity=10", "--max_concurrency=2"], "ConfigError: kv_capacity: 10 tokens = 1 Main KV page of 64 tokens, fewer than C = 2"),
    # CFG-6: a Main KV below one max_context lowers it; a prompt beyond what Main KV holds is refused
    (["--kv_capacity=256", "--max_context=1024", "--token_ids=" + ",".join(["7"] * 300)],
     "RequestError: prompt: 300 tokens exceed max_context=256"),
    (["--max_context=100000000"], "ConfigError: kv_capacity: "),  # cannot fit the 1 GiB default budget
    (["--device_state_slots=-1"], "ConfigError: context_cache.device_state_slots: "),
    (["--host_capacity_bytes=-1"], "ConfigError: context_cache.host_capacity_bytes: "),
    (["--model=builtin:nope"], "ConfigError: model: unknown built-in model 'builtin:nope'"),
    (["hello"], "UsageError: unexpected argument 'hello' (the prompt goes in --prompt)"),
])
def test_generate_refuses_before_loading(ninfer, args, line_start):
    _refused(ninfer("generate", *args), "generate", line_start)


def test_long_text_prompt_is_counted_with_the_tokenizer_only(ninfer):
    from ninfer_jax.frontend.tokenizer import Tokenizer

    n = len(Tokenizer.builtin().encode(LONG))
    assert n > 8
    line = _refused(ninfer("generate", "--max_context=8", f"--prompt={LONG}"), "generate", "RequestError")
    assert line.endswith(f"prompt: {n} tokens exceed max_context=8")


def test_model_folder_problems(ninfer, tmp_path, checkpoint):
    missing = tmp_path / "missing"
    _refused(ninfer("generate", f"--model={missing}"), "generate",
             f"ConfigError: model: '{missing}' is neither a folder nor builtin:tiny-hybrid")
    (tmp_path / "empty").mkdir()
    _refused(ninfer("generate", f"--model={tmp_path / 'empty'}"), "generate", "ConfigError: config.json: not found")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{oops")
    _refused(ninfer("generate", f"--model={tmp_path / 'bad'}"), "generate",
             "ConfigError: config.json: is not valid JSON")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "llama"}')
    _refused(ninfer("generate", f"--model={tmp_path / 'odd'}"), "generate", "ConfigError: model_type: unknown 'llama'")
    folder = checkpoint("noweights", weights=False)
    _refused(ninfer("generate", f"--model={folder}", "--token_ids=1,2"), "generate",
             f"CheckpointError: '{folder}' holds no model.safetensors")


def test_folder_without_tokenizer_needs_token_ids(ninfer, checkpoint):
    folder = checkpoint("ck")
    _refused(ninfer("generate", f"--model={folder}"), "generate",
             f"RequestError: {folder} ships no tokenizer: pass token ids")
    _refused(ninfer("chat", f"--model={folder}"), "chat", f"RequestError: {folder} ships no tokenizer: chat needs one")
    _refused(ninfer("generate", f"--model={folder}", "--token_ids=1,2000"), "generate",
             "RequestError: prompt: token id 2000 outside the vocabulary [0, 1024)")


@pytest.mark.parametrize("args, line_start", [
    (["--temperature=1000"], "RequestError: sampling.temperature"),
    (["--max_context=8", f"--prompt={LONG}"], "InputTooLongError: input has "),
    (["--messages=[not json"], "UsageError: --messages is not valid JSON"),
    (['--messages=[{"role": "wizard", "content": "hi"}]'], "UnknownRoleError: "),
    (["--max_concurrency=0"], "ConfigError: max_concurrency"),
])
def test_chat_refuses_before_loading(ninfer, args, line_start):
    _refused(ninfer("chat", *args), "chat", line_start)


def test_remote_bad_input_is_refused_before_connecting(ninfer):
    # generate_remote / chat_remote are replaced by the fixture: calling them fails the test.
    _refused(ninfer("generate", "--server=127.0.0.1:1", "--seed=-5"), "generate", "RequestError: sampling.seed")
    _refused(ninfer("generate", "--server=127.0.0.1:1", "--token_ids=1,x"), "generate",
             "RequestError: prompt: --token_ids must be comma-separated integers")
    _refused(ninfer("chat", "--server=127.0.0.1:1", "--temperature=-1"), "chat", "RequestError: sampling.temperature")


def test_serve_and_trace_check_the_config_first(ninfer, tmp_path):
    _refused(ninfer("serve", "--max_context=1"), "serve", "ConfigError: max_context")
    _refused(ninfer("serve", f"--model={tmp_path / 'nope'}"), "serve", "ConfigError: model: ")
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    _refused(ninfer("trace", str(trace), "--max_concurrency=9"), "trace", "ConfigError: max_concurrency")
    _refused(ninfer("trace", str(trace), "--program=sim", "--seed=-1"), "trace", "RequestError: sampling.seed")


def test_unusable_compilation_cache_folder_is_a_usage_error(ninfer, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _refused(ninfer("generate", f"--compilation_cache={blocker / 'cache'}"), "generate",
             "ConfigError: compilation_cache: ")


def test_good_input_passes_preflight_and_reaches_the_engine(ninfer, monkeypatch):
    seen = {}

    class Reached(Exception):
        pass

    def engine(self, config, **kwargs):
        seen["config"] = config
        raise Reached

    monkeypatch.setattr("ninfer_jax.engine.engine.Engine.__init__", engine)
    with pytest.raises(Reached):
        ninfer("generate", "--prompt=Hello there", "--max_context=64", "--max_concurrency=2", "--compilation_cache=off")
    config = seen["config"]
    assert (config.model, config.dtype, config.max_context, config.max_concurrency) == (
        "builtin:tiny-hybrid", "auto", 64, 2)


def test_flag_errors_are_one_line_exit_2(ninfer):
    _refused(ninfer("serve", "--port=70000"), "serve", "IllegalFlagValueError: flag --port=70000")
    _refused(ninfer("serve", "--port=-2"), "serve", "IllegalFlagValueError: flag --port=-2")
    # -1 turns gRPC off, which only makes sense with an HTTP port.
    _refused(ninfer("serve", "--port=-1"), "serve", "ValueError: --port=-1 turns gRPC off")
    # The HTTP API's own flags without an HTTP port would do nothing: refused, not dropped.
    _refused(ninfer("serve", "--model=fake:x", "--cors_origins=*"), "serve",
             "UsageError: --cors_origins configures the HTTP API: give --http_port=PORT as well")
    _refused(ninfer("serve", "--model=fake:x", "--request_log=/tmp/x.jsonl"), "serve", "UsageError: --request_log")
    _refused(ninfer("generate", "--dtype=float16"), "generate", "IllegalFlagValueError: flag --dtype=float16")
    _refused(ninfer("generate", "--no_such_flag=1"), "generate", "UnrecognizedFlagError: ")


# ---- the library function -------------------------------------------------------------------
def test_preflight_returns_what_it_checked(checkpoint):
    pre = preflight(EngineConfig(max_context=64), prompt="Hello", sampling={"temperature": 0.0, "max_tokens": 4})
    assert pre.prompt_ids == tuple(pre.tokenizer.encode("Hello"))
    assert pre.sampling.max_tokens == 4 and pre.model.vocab_size == 1024
    assert pre.capacity.pages_per_request == 1
    pre = preflight(EngineConfig(), messages=[{"role": "user", "content": "hi"}])
    assert pre.prompt_ids and pre.tokenizer is not None
    assert preflight(EngineConfig(), prompt=[1, 2, 3]).prompt_ids == (1, 2, 3)
    with pytest.raises(CheckpointError):
        preflight(EngineConfig(model=checkpoint("ck", weights=False)), prompt=[1])


@pytest.mark.parametrize("ids", [[], [1, 5000], list(range(1, 9)), list(range(1, 12))])
def test_preflight_and_the_engine_refuse_a_prompt_alike(ids):
    """One rule (engine/core.py check_submission): the same error from preflight as from submit."""
    from ninfer_jax import Engine
    from ninfer_jax.sim import SimProgram

    config = EngineConfig(max_context=8, max_concurrency=1, progress=False)
    with pytest.raises(RequestError) as before:
        preflight(config, prompt=ids)
    engine = Engine(config, program=SimProgram(config), start=False)
    try:
        with pytest.raises(RequestError) as later:
            engine.submit(ids)
    finally:
        engine.close()
    assert str(before.value) == str(later.value)


def test_preflight_refuses_bad_arguments():
    with pytest.raises(ConfigError):
        preflight({"model": "builtin:tiny-hybrid"})
    with pytest.raises(ConfigError):
        preflight(EngineConfig(), prompt="hi", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(RequestError, match="sampling.seed"):
        preflight(EngineConfig(), sampling={"seed": -1})
