"""scripts/device_check.py only runs where a GPU is lent: keep its CPU smoke mode working."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.py"


def test_device_check_tiny_interpret_runs(capsys):
    spec = importlib.util.spec_from_file_location("pk_device_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--backend", "interpret", "--tiny", "--reps", "1", "--only", "gather,causal_conv1d_update"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip().splitlines()[-1].startswith("{")
