"""`ninfer lower`: every compiled step and Pallas kernel lowered for CUDA on a machine without a GPU,
from shapes alone (ninfer_jax/lower.py), in process.

The `ninfer` fixture fails a test that builds an engine or a Program or loads a model; here the
checkpoint reader and XLA compilation are refused too, and the Qwen3-Next / Qwen3.5 MoE folders
hold config.json alone. Lowering only: nothing is compiled, for CUDA or otherwise.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from ninfer_jax import lower
from ninfer_jax.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "tests" / "fixtures" / "oracle"
TRITON = "__gpu$xla.gpu.triton"
KERNELS = {"paged_write_kv", "paged_prefill_attention", "paged_decode_attention", "chunk_gated_delta_rule",
           "recurrent_gated_delta_rule_step", "causal_conv1d", "page_gather", "page_scatter"}


class Forbidden(AssertionError):
    pass


@pytest.fixture
def run_lower(ninfer, monkeypatch):
    """`ninfer lower *args` in process; reading tensors or compiling anything fails the test."""
    def refuse(what):
        def f(*a, **k):
            raise Forbidden(f"ninfer lower {what}")
        return f

    monkeypatch.setattr("ninfer_jax.model.weights.load_params", refuse("read a checkpoint's tensors"))
    monkeypatch.setattr("ninfer_jax.model.weights.Tensors", refuse("opened a checkpoint's safetensors"))
    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse("compiled a step"))
    return lambda *args: ninfer("lower", *args)


def _config_only(tmp_path, fixture: str, **changes) -> str:
    """A folder holding only `fixture`'s config.json (no safetensors, no tokenizer), with `changes`."""
    folder = tmp_path / fixture
    folder.mkdir()
    raw = json.loads((ORACLE / fixture / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **changes}))
    assert os.listdir(folder) == ["config.json"]
    return str(folder)


# The oracle fixtures' GDN heads (Dk = Dv = 8) are below the Triton kernels' minimum of 16 (real
# checkpoints have 128): the folders below raise them to 16, the last test keeps them.
GPU_LEGAL = {"linear_key_head_dim": 16, "linear_value_head_dim": 16}


def _lines(out: str) -> dict[str, str]:
    return {line.split()[1]: line for line in out.splitlines()}


def test_lower_builtin_for_cuda_every_step_and_kernel(run_lower):
    code, out, err = run_lower("--platform=cuda", "--max_concurrency=2")
    assert code == 0, err
    lines = _lines(out)
    assert all(line.startswith("lowered ") for line in lines.values()), out
    steps = ["prefill[t=64]", "decode[b=2]", "prefill_spec[t=64]",  # an MTP head: k=2
             "spec_decode[b=2,k=2]", "spec_commit[b=2,k=2]"]
    kernels = ["paged_attention.write_kv[t=64]", "paged_attention.prefill_attention[t=64]",
               "paged_attention.decode_attention[b=2]", "gdn.chunk_gated_delta_rule[t=64]",
               "gdn.recurrent_gated_delta_rule_step[b=2]", "conv1d.causal_conv1d_prefill[t=64]",
               "conv1d.causal_conv1d_update[b=2]", "page_copy.gather[b=2]", "page_copy.scatter[b=2]",
               "page_copy.copy[b=2]"]
    movers = {n for n in lines if n.split("[")[0] in ("pack", "unpack", "copy", "hidden")}
    assert list(lines) == steps + ["hidden_logits"] + sorted(movers, key=list(lines).index) + kernels
    assert {"pack[main_kv,n=1]", "unpack[state_slots,n=1]", "copy[backend_kv:mtp,n=1]",
            "hidden[state_slots,n=1]"} <= movers and len(movers) == 3 * 6 + 1
    for name in steps + kernels:  # every model step and kernel holds Triton custom calls
        assert f"custom calls: {TRITON} x" in lines[name], lines[name]
    assert "paged_decode_attention x1" in lines["decode[b=2]"] and "chunk_gated_delta_rule x3" in lines["prefill[t=64]"]
    assert "lowering 35 steps of builtin:tiny-hybrid (float32) for cuda, kernels pallas" in err
    assert "lowered 35 of 35 steps for cuda" in err


@pytest.mark.parametrize("fixture", ["qwen3_next", "qwen3_5_moe_text"])
def test_lower_a_config_only_folder_for_cuda(run_lower, tmp_path, fixture):
    folder = _config_only(tmp_path, fixture, **GPU_LEGAL)
    code, out, err = run_lower(f"--model={folder}", "--max_concurrency=2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["failed"] == [] and report["lowered"] == len(report["steps"])
    assert (report["platform"], report["backend"]) == ("cuda", "pallas")
    assert report["shapes"]["model_type"] == fixture and report["shapes"]["speculative_tokens"] == 0  # no MTP head
    by_name = {s["name"]: s for s in report["steps"]}
    assert [n for n, s in by_name.items() if s["kind"] == "step"] == ["prefill[t=64]", "decode[b=2]"]
    seen = set()
    for s in report["steps"]:
        assert s["ok"] and s["error"] is None, s
        if s["kind"] in ("step", "kernel"):
            assert s["custom_calls"].get(TRITON, 0) >= 1, s
            seen |= set(s["kernels"])
    assert seen == KERNELS
    assert set(by_name["prefill[t=64]"]["kernels"]) == KERNELS - {"paged_decode_attention",
                                                                  "recurrent_gated_delta_rule_step"}


def test_a_failing_step_is_named_exit_1(run_lower, monkeypatch):
    def broken(abstract, b):
        raise RuntimeError(f"no decode for b={b}\nsecond line never shown")

    monkeypatch.setitem(lower.BUILDERS, "decode", broken)
    code, out, err = run_lower("--max_concurrency=4", "--steps=decode,hidden_logits")
    assert code == 1
    assert out.splitlines() == ["FAILED  decode[b=2]  RuntimeError: no decode for b=2",
                                "FAILED  decode[b=4]  RuntimeError: no decode for b=4",
                                "lowered hidden_logits  custom calls: none"]
    assert err.splitlines()[-1] == ("ninfer lower: LoweringError: decode[b=2] did not lower: RuntimeError: no decode "
                                    "for b=2 (and 1 more: decode[b=4])")


def test_the_xla_backend_lowers_a_prefill_per_page_table_width(run_lower):
    """The XLA attention reads its whole table, so the Program compiles a prefill per width
    (plan/workspace.prefill_table_widths); lower lowers each, named with its width."""
    code, out, err = run_lower("--backend=xla", "--max_concurrency=1", "--max_context=2048", "--steps=prefill")
    assert code == 0, err
    widths = ("p=2]", "p=8]", "p=32]")  # the built-in's MTP head: prefill_spec at each width too
    assert [line.split()[1] for line in out.splitlines()] == ([f"prefill[t=64,{w}" for w in widths]
                                                              + [f"prefill_spec[t=64,{w}" for w in widths])


def test_gdn_heads_too_small_for_triton_fail_by_name(run_lower, tmp_path):
    """The fixture's own Dk = Dv = 8: the Triton delta-rule kernels refuse them, named."""
    folder = _config_only(tmp_path, "qwen3_next")
    code, out, err = run_lower(f"--model={folder}", "--max_concurrency=1", "--steps=gdn,conv1d")
    assert code == 1
    lines = _lines(out)
    assert lines["gdn.chunk_gated_delta_rule[t=64]"] == (
        "FAILED  gdn.chunk_gated_delta_rule[t=64]  KernelArgumentError: backend 'pallas' needs Dk a power of two "
        ">= 16, got Dk=8")
    assert lines["gdn.recurrent_gated_delta_rule_step[b=2]"].startswith("FAILED")
    assert lines["conv1d.causal_conv1d_prefill[t=64]"].startswith("lowered")
    assert "ninfer lower: LoweringError: gdn.chunk_gated_delta_rule[t=64] did not lower: KernelArgumentError" in err


@pytest.mark.parametrize("args, says", [
    (("--platform=tpu",), "ConfigError: platform: must be one of ('cuda', 'rocm', 'cpu')"),
    (("--platform=cpu", "--backend=pallas"), "ConfigError: backend: pallas lowers through Triton, for cuda or rocm"),
    (("--backend=mosaic",), "ConfigError: backend: must be one of ('xla', 'pallas', 'interpret')"),
    (("--steps=nothing",), "ConfigError: steps: 'nothing' selects no step"),
    (("--max_concurrency=9",), "ConfigError: max_concurrency: C must be an int in [1, 8]"),
    (("--speculative_tokens=5",), "ConfigError: speculative_tokens: must be an int in [0, 4]"),
    (("--model=/nonexistent/folder",), "ConfigError: model: '/nonexistent/folder' is neither a folder"),
    (("stray",), "UsageError: unexpected argument 'stray'"),
])
def test_bad_flags_exit_2(run_lower, args, says):
    code, out, err = run_lower(*args)
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith(f"ninfer lower: {says}"), err


def test_speculative_steps_need_an_mtp_head_exit_2(run_lower, tmp_path):
    folder = _config_only(tmp_path, "qwen3_5_moe_text", **GPU_LEGAL)
    code, out, err = run_lower(f"--model={folder}", "--speculative_tokens=2")
    assert code == 2 and out == "" and "has no MTP head" in err


def test_lower_all_for_cpu_in_process():
    """The pure function the command prints: xla kernels for cpu, so no custom call at all."""
    results = lower.lower_all(EngineConfig(max_concurrency=1), platform="cpu", speculative_tokens=0,
                              only="decode,kernel")
    assert [r.name for r in results][:1] == ["decode[b=2]"] and len(results) == 1 + len(lower.KERNELS)
    assert all(r.ok and r.custom_calls == {} and r.kernels == {} for r in results), results
    assert lower.failure(results) is None


def test_a_folder_without_config_json_exits_2_through_the_entry_point(tmp_path):
    (tmp_path / "empty").mkdir()
    out = subprocess.run([sys.executable, "-m", "ninfer_jax.cli", "lower", f"--model={tmp_path / 'empty'}"],
                         capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.startswith("ninfer lower: ") and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "config.json" in out.stderr


def _drafter_config_only(tmp_path, block: int = 4) -> str:
    """A DFlash drafter folder for the built-in model holding config.json alone (issue 35)."""
    folder = tmp_path / "dflash"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 1024, "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": 1023, "target_layer_ids": [0, 2], "block_size": block}}))
    return str(folder)


def test_lower_the_dflash_steps_from_a_config_only_drafter(run_lower, tmp_path):
    """--speculative_method=dflash: the speculative steps are the DFlash ones (the drafter's
    context pool, its params traced from its config alone), each lowered for CUDA with the
    target's Triton kernels inside; the drafter's pool has its movers."""
    drafter = _drafter_config_only(tmp_path)
    code, out, err = run_lower("--max_concurrency=2", "--speculative_method=dflash", f"--draft_model={drafter}",
                               "--speculative_tokens=3", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["failed"] == [] and report["lowered"] == len(report["steps"])
    assert report["shapes"]["speculative_method"] == "dflash" and report["shapes"]["speculative_tokens"] == 3
    by_name = {s["name"]: s for s in report["steps"]}
    spec = ["prefill_spec[t=64]", "spec_decode[b=2,k=3]", "spec_commit[b=2,k=3]"]
    assert [n for n, s in by_name.items() if s["kind"] == "step"] == ["prefill[t=64]", "decode[b=2]"] + spec
    for name in spec[:2]:  # the target's forward inside: its paged attention and delta-rule kernels
        assert by_name[name]["custom_calls"].get(TRITON, 0) >= 1, by_name[name]
    assert {"copy[backend_kv:dflash,n=1]", "pack[backend_kv:dflash,n=1]"} <= set(by_name)
    assert not any("backend_kv:mtp" in n for n in by_name), "the MTP pool is not built with a drafter"


def test_lower_refuses_a_drafter_that_does_not_fit_exit_2(run_lower, tmp_path):
    drafter = _drafter_config_only(tmp_path, block=3)
    code, out, err = run_lower("--speculative_method=dflash", f"--draft_model={drafter}", "--speculative_tokens=3")
    assert code == 2 and out == ""
    assert "speculative_tokens: 3 drafts: the drafter's block of 3 positions drafts at most 2" in err, err
