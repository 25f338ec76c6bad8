"""Shared bits of the trace tests: hand-made Marconi lines and trace files."""
import json


def marconi_line(session, turn, ts, prompt, output, **over) -> str:
    obj = {"session_id": session, "turn_id": turn, "ts": ts, "num_input_tokens": len(prompt),
           "num_output_tokens": len(output), "input_tokens": list(prompt), "output_tokens": list(output)}
    obj.update(over)
    return json.dumps(obj)


def write_lines(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run_cli(capsys, *args: str):
    """`ninfer *args` in process: (exit status, stdout, stderr); absl flags reset around it."""
    from absl import flags

    from ninfer_jax import cli

    flags.FLAGS.unparse_flags()
    try:
        code = cli.main(cli.parse_flags(["ninfer", *args]))
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.out, out.err
