"""Shared bits of the trace tests: hand-made Marconi lines and trace files."""
import json

from cli_runner import run_cli  # noqa: F401  (re-exported for the trace tests)


def marconi_line(session, turn, ts, prompt, output, **over) -> str:
    obj = {"session_id": session, "turn_id": turn, "ts": ts, "num_input_tokens": len(prompt),
           "num_output_tokens": len(output), "input_tokens": list(prompt), "output_tokens": list(output)}
    obj.update(over)
    return json.dumps(obj)


def write_lines(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


