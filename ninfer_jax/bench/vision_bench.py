"""`ninfer bench vision [--json]`: images and screenshots through NInfer vs transformers (issue 34).

One random Qwen3.5 vision-language checkpoint, built by transformers (`Qwen3_5ForConditionalGeneration`
with random weights, saved as the hub ships one) and loaded by both sides from the same folder,
float32 on the CPU. Three figures, each side measured in turn for `--rounds` rounds (medians):

- `encoder_images_per_s`: the vision tower on one 512x512 image (1,024 patches, 256 merged
  tokens): the engine's `Program.encode_media` (its warmed bucket) vs transformers' `get_image_features`;
- `prefill_tokens_per_s`: a cold 1-image, 1,024-token prompt (384 text tokens, the image's 256,
  382 text tokens) to its first token: the engine (context cache off; a new image each round, so
  every round encodes it once and prefills all of it) vs one transformers forward (logits of the
  last position) on the same image;
- `turn2_ttft_ratio`: a screenshot agent's second turn (2,048 tokens: 1,300 tokens of system
  text and tools, a user message with a screenshot, the 32-token reply, then a short user message
  with a second screenshot: 1,750 tokens of history, ~300 new), TTFT on the engine that served
  turn 1 ÷ TTFT on a cold engine (context cache off). Each round brings new screenshots.

The cold engine keeps the default media cache: with a media cache of 0 an image is encoded again
by every prefill chunk that covers part of it (twice for an image across a chunk boundary), which
a cold engine as served does not do; the figures before commit "bench vision: a cold engine
encodes each image once" had that cache of 0 (docs/model.md).

Flags after `vision`: --geometry=small|0.8b (text; default small: 8 layers, 32k vocabulary),
--tower=small|released (default small: 6 blocks of the released width; released: 27 blocks,
hidden 1152), --rounds=3, --chunk_size=256, --cold_media_cache_bytes=N (the cold engine's media
cache; default the engine's default).
"""
from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from ninfer_jax.bench import int_arg, str_arg
from ninfer_jax.bench.geometries import GEOMETRIES
from ninfer_jax.bench.stats import median

# The released Qwen3.5 tower's geometry (patch 16, temporal 2, merge 2, 27 blocks of 1152).
TOWERS = {"released": {"depth": 27, "hidden_size": 1152, "num_heads": 16, "intermediate_size": 4304,
                       "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
                       "num_position_embeddings": 2304}}
TOWERS["small"] = dict(TOWERS["released"], depth=6)
IMAGE_GRID = (1, 32, 32)  # 512 x 512 pixels: 1,024 patches, 256 merged tokens


def _say(msg: str) -> None:
    print(f"[bench vision] {msg}", file=sys.stderr, flush=True)


def _checkpoint(folder: str, geometry: dict, tower: dict):
    """Save a random VL checkpoint in `folder`; returns (transformers model, vision token ids)."""
    import torch
    import transformers as tf

    vocab = geometry["vocab_size"]
    ids = {"image_token_id": vocab - 4, "video_token_id": vocab - 3, "vision_start_token_id": vocab - 2,
           "vision_end_token_id": vocab - 1}
    text = {k: v for k, v in geometry.items() if k != "model_type"}
    text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=[11, 11, 10], mrope_interleaved=True)
    cfg = tf.Qwen3_5Config(text_config=text, vision_config=dict(tower, out_hidden_size=geometry["hidden_size"]),
                           tie_word_embeddings=geometry.get("tie_word_embeddings", False), **ids)
    torch.manual_seed(0)
    hf = tf.Qwen3_5ForConditionalGeneration._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    hf.save_pretrained(folder, safe_serialization=True)
    return hf, ids


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(argv: list[str]) -> dict:
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
        return {"transformers": "not installed"}
    import torch

    from ninfer_jax import ContextCacheConfig, Engine, EngineConfig, SamplingParams
    from ninfer_jax.config import MediaConfig

    geometry_name, tower_name = str_arg(argv, "geometry", "small"), str_arg(argv, "tower", "small")
    if geometry_name not in GEOMETRIES or tower_name not in TOWERS:
        raise SystemExit(f"ninfer bench vision: --geometry one of {sorted(GEOMETRIES)}, --tower one of {sorted(TOWERS)}")
    rounds, chunk = int_arg(argv, "rounds", 3), int_arg(argv, "chunk_size", 256)
    cold_media = int_arg(argv, "cold_media_cache_bytes", -1)
    cold_media = None if cold_media < 0 else cold_media
    geometry, tower = GEOMETRIES[geometry_name], TOWERS[tower_name]
    figures: dict = {"geometry": geometry_name, "tower": tower_name, "rounds": rounds, "chunk_size": chunk,
                     "cold_media_cache_bytes": "default" if cold_media is None else cold_media,
                     "image_grid": list(IMAGE_GRID)}
    rng = np.random.default_rng(0)
    patch_dim = 3 * tower["temporal_patch_size"] * tower["patch_size"] ** 2
    n_patches = int(np.prod(IMAGE_GRID))
    n_image = n_patches // tower["spatial_merge_size"] ** 2

    def pixels():
        return rng.standard_normal((n_patches, patch_dim)).astype(np.float32)

    with tempfile.TemporaryDirectory(prefix="ninfer-vision-bench-") as folder:
        _say(f"building a random {geometry_name} text + {tower_name} tower checkpoint")
        hf, ids = _checkpoint(folder, geometry, tower)
        vocab_text = ids["image_token_id"]  # text ids below the vision ids

        def text(n):
            return rng.integers(0, vocab_text, n).tolist()

        def image_run():
            return [ids["vision_start_token_id"]] + [ids["image_token_id"]] * n_image + [ids["vision_end_token_id"]]

        def config(**kw):
            return EngineConfig(model=folder, dtype="float32", max_concurrency=2, max_context=4096, chunk_size=chunk,
                                progress=False, **kw)

        # new images every round: the cold engine's media cache misses (--cold_media_cache_bytes=0: the old figures)
        media = {} if cold_media is None else {"media": MediaConfig(cache_bytes=cold_media)}
        cold_cfg = config(context_cache=ContextCacheConfig(enabled=False), **media)
        with Engine(cold_cfg) as cold, Engine(config()) as warm:
            grid = np.array([IMAGE_GRID])
            # ---- the vision encoder ------------------------------------------------------------
            pix = pixels()
            grid_t = torch.tensor(grid)
            ours_enc = lambda: cold.program.encode_media(pix, grid)  # noqa: E731 (the engine's warmed bucket)

            def theirs_enc():
                with torch.no_grad():
                    hf.model.get_image_features(torch.from_numpy(pix), grid_t)

            ours_enc(), theirs_enc()
            a, b = zip(*[(_timed(ours_enc), _timed(theirs_enc)) for _ in range(rounds)])
            figures.update(encoder_images_per_s=1 / median(a), encoder_hf_images_per_s=1 / median(b),
                           encoder_ratio_vs_hf=median(b) / median(a))
            _say(f"encoder: {1 / median(a):.2f} vs transformers {1 / median(b):.2f} images/s")
            # ---- a cold 1-image, 1024-token prompt to its first token -------------------------
            prompt = text(384) + image_run() + text(1024 - 384 - n_image - 2)
            assert len(prompt) == 1024
            one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
            mm = torch.tensor([[1 if t == ids["image_token_id"] else 0 for t in prompt]])

            def ours_prefill(image):
                cold.submit(prompt, one, images=[(image, grid)]).result()

            def theirs_prefill(image):
                with torch.no_grad():
                    hf(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(image), image_grid_thw=grid_t,
                       mm_token_type_ids=mm, use_cache=False, logits_to_keep=1)

            ours_prefill(pix), theirs_prefill(pix)
            images = [pixels() for _ in range(rounds)]  # a new image each round: the engine's media cache misses
            a, b = zip(*[(_timed(lambda: ours_prefill(im)), _timed(lambda: theirs_prefill(im))) for im in images])
            figures.update(prefill_tokens_per_s=1024 / median(a), prefill_hf_tokens_per_s=1024 / median(b),
                           prefill_ratio_vs_hf=median(b) / median(a))
            _say(f"1-image 1024-token prefill: {1024 / median(a):.0f} vs transformers {1024 / median(b):.0f} tokens/s")
            # ---- turn 2 of a screenshot agent: cached vs cold TTFT --------------------------
            system = text(1300)
            reply = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
            cached, cold_ttft = [], []
            for r in range(rounds + 1):  # the first round warms both engines' buckets
                shot1, shot2 = (pixels(), grid), (pixels(), grid)
                turn1 = system + text(120) + image_run() + text(40)
                out = warm.submit(turn1, reply, images=[shot1]).result()
                turn2 = turn1 + list(out.token_ids) + text(30) + image_run()
                turn2 += text(2048 - len(turn2))
                got = warm.submit(turn2, one, images=[shot1, shot2]).result()
                base = cold.submit(turn2, one, images=[shot1, shot2]).result()
                assert got.token_ids == base.token_ids
                if r:
                    cached.append(got.ttft_s)
                    cold_ttft.append(base.ttft_s)
                    figures["turn2_cached_tokens"] = got.usage.cached_tokens
            figures.update(turn2_tokens=len(turn2), turn2_ttft_cached_s=median(cached),
                           turn2_ttft_cold_s=median(cold_ttft), turn2_ttft_ratio=median(cached) / median(cold_ttft))
            _say(f"turn 2 ({len(turn2)} tokens, {figures['turn2_cached_tokens']} cached): TTFT "
                 f"{median(cached):.3f}s vs cold {median(cold_ttft):.3f}s (ratio {figures['turn2_ttft_ratio']:.3f})")
    return figures
