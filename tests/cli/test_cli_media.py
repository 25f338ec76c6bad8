"""`ninfer generate --image=FILE` and `ninfer chat --image=FILE` (issue 34) on a whole tiny VL checkpoint
folder (tests/tiny_vl.py), and every bad image refused before the model loads (exit 2, one line).

The runs that succeed load the model in process (`run_cli`); their text equals the Python API's
on the same folder and image (`Engine.generate` / `Engine.chat`)."""
from __future__ import annotations


import numpy as np
import pytest
from PIL import Image

from cli_runner import run_cli

pytest.importorskip("transformers")
pytest.importorskip("torch")
from tiny_vl import save_vl_folder  # noqa: E402  (after the skips)

COMMON = ("--dtype=float32", "--max_concurrency=1", "--max_context=256", "--chunk_size=16", "--max_tokens=4",
          "--temperature=0")


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl_cli")
    save_vl_folder(folder)
    rgb = np.random.default_rng(0).integers(0, 256, (24, 20, 3), np.uint8)
    image = folder / "shot.png"
    Image.fromarray(rgb).save(image)
    return str(folder), str(image)


def _engine(folder):
    from ninfer_jax import Engine, EngineConfig

    return Engine(EngineConfig(model=folder, dtype="float32", max_concurrency=1, max_context=256, chunk_size=16,
                               progress=False))


def test_generate_and_chat_with_an_image(vl, capsys):
    from ninfer_jax import SamplingParams

    folder, image = vl
    code, out, err = run_cli(capsys, "generate", f"--model={folder}", f"--image={image}", "--prompt=describe",
                             *COMMON)
    assert code == 0, err
    code, chat_out, err = run_cli(capsys, "chat", f"--model={folder}", f"--image={image}", "--prompt=describe",
                                  *COMMON)
    assert code == 0, err
    with open(image, "rb") as f:
        data = f.read()
    sp = SamplingParams(temperature=0, max_tokens=4, seed=0)
    with _engine(folder) as engine:
        want = engine.submit("describe", sp, images=[data]).result()
        want_chat = engine.chat([{"role": "user", "content": [{"type": "text", "text": "describe"},
                                                              {"type": "image", "image": data}]}], sampling=sp)
    assert want.usage.prompt_tokens > 3  # the image's tokens are in the prompt
    assert out == want.text + "\n"
    assert chat_out == want_chat.text + "\n"


def test_bad_images_are_refused_before_the_model_loads(vl, tmp_path, ninfer):
    """`ninfer` (tests/cli/conftest.py) fails the test if anything loads a model."""
    folder, image = vl
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    cases = [
        ((f"--model={folder}", f"--image={tmp_path / 'missing.png'}"), "UsageError"),
        ((f"--model={folder}", f"--image={junk}"), "UndecodableMediaError"),
        ((f"--image={image}",), "MediaNotSupportedError"),  # the built-in model is text-only
        ((f"--model={folder}", f"--image={image}", "--max_input_pixels=100"), "TooManyPixelsError"),
    ]
    for command in ("generate", "chat"):
        for args, error in cases:
            code, out, err = ninfer(command, "--prompt=describe", *args)
            assert code == 2, (command, args, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"ninfer {command}: {error}:"), (command, args, err)
