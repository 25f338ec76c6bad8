"""`ninfer *args` run in this process, for the tests of the CLI and of `ninfer trace`."""
from __future__ import annotations


def run_cli(capsys, *args: str):
    """`ninfer *args` in process: (exit status, stdout, stderr); absl flags reset around it."""
    from absl import flags

    from server import cli  # the whole `ninfer`: ninfer_jax's commands and the server's

    flags.FLAGS.unparse_flags()
    try:
        code = cli.main(cli.parse_flags(["ninfer", *args]))
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.out, out.err
