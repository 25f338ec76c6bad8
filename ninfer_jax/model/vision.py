"""The Qwen3.5 vision tower (ViT + patch merger) in JAX: config, forward, bucketed compile.

Holds `VisionConfig` (parsed from a checkpoint's nested `vision_config`, with transformers'
`Qwen3_5VisionConfig` defaults for missing keys), `encode` (one call over any number of images
and videos) and `encode_bucketed` (the same, padded to a bucket of patch counts so that new
image sizes do not compile without bound). Parameter shapes, the checkpoint name mapping and
the loader are in `vision_weights.py`.

The forward, checked against transformers' `Qwen3_5VisionModel` (tests/model/test_vision_tower.py):
- patch embed: the Conv3d whose kernel equals its stride is one product of each flattened
  `[C*T*P*P]` patch (the processor's `pixel_values` row) with the kernel `[C*T*P*P, H]`, + bias;
- the learned `[S*S, H]` position table (S = sqrt(num_position_embeddings)) resampled to each
  image's `(h, w)` patch grid, bilinear with align_corners=True (4 taps a patch), the same for
  every temporal patch of a video;
- patches of one image run in 2x2 (spatial_merge_size^2) merge-block order, as the processor
  emits them; the 2-D rotary takes each patch's (row, column): head_dim/4 frequencies, the row
  angles then the column angles, repeated twice (rotate-half over the whole head);
- `depth` pre-LayerNorm blocks (eps 1e-6): attention (qkv with bias, no QK-norm, full within
  each temporal patch of each image, never across them: a block-diagonal mask) and a
  fc1 -> act -> fc2 MLP (`hidden_act`, gelu-tanh in the released models);
- the merger: LayerNorm over H, then each merge block's 4 patches concatenated `[4H]`,
  fc1 -> exact GELU -> fc2 to `out_hidden_size`: one token per merge block.

Products: float32 at Precision.HIGHEST, bf16 as stored and accumulated in float32 (as
`layers.matmul`). Everything that depends on `grid_thw` (tap indices and weights, rotary
positions, attention segments, where each patch goes) is computed on the Host with numpy and
passed in as arrays, so one compiled program serves every grid of the same padded row count.

Layout and invariance: each segment (a temporal patch of an image) starts at a multiple of
KEY_CHUNK rows (`patch_layout`, `segment_align`), the rows between are padding, and a call has
at least MIN_TOKENS tokens (256 rows at merge size 2). Every product is one native product over
all rows (at least 64), and attention runs keys in fixed chunks of KEY_CHUNK (`_attention`).
XLA's CPU dot then gives a row the same bits whatever the row count, so an image's tokens do not
depend on the padding, the bucket or the other images of the call: bit-identical in the tests
(CPU). Measured without these: 8-row blocks or fewer than 64 rows, a key axis of another
length, or a segment straddling the key chunks otherwise, each moved results by an ulp or two.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.errors import ConfigError, RequestError
from pallas_kernels._common import next_pow2, softmax, tree_sum

LN_EPS = 1e-6  # the reference's LayerNorms hard-code it
# hidden_act -> tanh-approximated GELU or not (the merger always uses the exact one).
_ACTIVATIONS = {"gelu_pytorch_tanh": True, "gelu_new": True, "gelu_fast": True, "gelu": False}
KEY_CHUNK = 128  # keys per product of the attention's probabilities with the values
MIN_TOKENS = 64  # merged tokens a call is padded to at least (256 patches at merge size 2)


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values of one patch: a `pixel_values` row (C*T*P*P)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        """Patches per output token (spatial_merge_size^2)."""
        return self.spatial_merge_size ** 2

    @property
    def grid_side(self) -> int:
        """Side of the square learned position table."""
        return int(round(self.num_position_embeddings ** 0.5))


# ---- config parsing ---------------------------------------------------------------------

def _field(raw: dict, names: tuple[str, ...], default: Any) -> tuple[str, Any]:
    for name in names:
        if raw.get(name) is not None:
            return name, raw[name]
    return names[0], default


def _positive_int(raw: dict, *names: str, default: int) -> int:
    name, value = _field(raw, names, default)
    if isinstance(value, (list, tuple)) and value and len(set(value)) == 1:
        value = value[0]  # patch sizes may be written per axis, e.g. [16, 16]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"vision_config.{name}", f"must be a positive integer, got {value!r}")
    return value


def parse_vision_config(raw: dict) -> VisionConfig:
    """A `VisionConfig` from a `vision_config` object (or a whole multimodal `config.json`,
    whose `vision_config` is used). Missing keys take the reference's defaults; values the
    tower cannot run are a `ConfigError` naming the field."""
    if isinstance(raw, dict) and isinstance(raw.get("vision_config"), dict):
        raw = raw["vision_config"]
    if not isinstance(raw, dict):
        raise ConfigError("vision_config", f"expected an object, got {type(raw).__name__}")
    d = VisionConfig()
    ints = {f: _positive_int(raw, *names, default=getattr(d, f)) for f, names in (
        ("depth", ("depth", "num_hidden_layers")), ("hidden_size", ("hidden_size",)),
        ("intermediate_size", ("intermediate_size",)), ("num_heads", ("num_heads", "num_attention_heads")),
        ("in_channels", ("in_channels",)), ("patch_size", ("patch_size",)),
        ("temporal_patch_size", ("temporal_patch_size",)), ("spatial_merge_size", ("spatial_merge_size",)),
        ("out_hidden_size", ("out_hidden_size",)), ("num_position_embeddings", ("num_position_embeddings",)))}
    act = raw.get("hidden_act") or d.hidden_act
    if act not in _ACTIVATIONS:
        raise ConfigError("vision_config.hidden_act",
                          f"{act!r} is not supported; expected one of {sorted(_ACTIVATIONS)}")
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", "axial") != "axial":
        raise ConfigError("vision_config.rope_parameters", f"only the 'axial' rope is supported, got {rope!r}")
    theta = rope.get("rope_theta", raw.get("rope_theta", d.rope_theta))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError("vision_config.rope_theta", f"must be a positive number, got {theta!r}")
    if raw.get("deepstack_visual_indexes"):
        raise ConfigError("vision_config.deepstack_visual_indexes",
                          f"deepstack features are not supported, got {raw['deepstack_visual_indexes']!r}")
    if ints["hidden_size"] % ints["num_heads"]:
        raise ConfigError("vision_config.num_heads",
                          f"{ints['num_heads']} does not divide hidden_size={ints['hidden_size']}")
    if (ints["hidden_size"] // ints["num_heads"]) % 4:
        raise ConfigError("vision_config.num_heads", f"head_dim={ints['hidden_size'] // ints['num_heads']} must be "
                          "a multiple of 4 (the 2-D rotary splits it into row and column halves)")
    side = int(round(ints["num_position_embeddings"] ** 0.5))
    if side * side != ints["num_position_embeddings"] or side < 2:
        raise ConfigError("vision_config.num_position_embeddings",
                          f"must be a square of at least 2x2, got {ints['num_position_embeddings']}")
    return VisionConfig(hidden_act=act, rope_theta=float(theta), **ints)


# ---- Host-side layout of the patches (numpy, from grid_thw) ------------------------------

def check_grid(vcfg: VisionConfig, grid_thw) -> np.ndarray:
    """`grid_thw` as an int64 `[n, 3]` array of (temporal, height, width) patch counts, or a
    RequestError: every entry positive, height and width multiples of spatial_merge_size."""
    grid = np.asarray(grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] == 0 or not np.issubdtype(grid.dtype, np.integer):
        raise RequestError("grid_thw: expected a non-empty integer [num_images, 3] array, "
                           f"got {grid.dtype} {grid.shape}")
    m = vcfg.spatial_merge_size
    for t, h, w in grid.tolist():
        if min(t, h, w) <= 0 or h % m or w % m:
            raise RequestError(f"grid_thw: ({t}, {h}, {w}) must be positive with height and width "
                               f"multiples of spatial_merge_size={m}")
    return grid.astype(np.int64)


def patch_layout(vcfg: VisionConfig, grid: np.ndarray) -> dict[str, np.ndarray]:
    """Per patch, in the processor's order (image by image, temporal patch by temporal patch,
    merge block by merge block, then row-major inside a block): `taps` int32 `[N, 4]` rows of
    the position table and `weights` float32 `[N, 4]` (bilinear, align_corners=True), `rows_cols`
    int32 `[N, 2]` (the rotary positions), `segment` int32 `[N]` (one id per temporal patch
    of each image: attention stays within a segment) and `slot` int64 `[N]`, the patch's row in
    the laid-out call: every segment starts at a multiple of `segment_align(vcfg)`, so that a
    segment's keys fill the attention's key chunks alike wherever it sits (`_attention`)."""
    m, side, align = vcfg.spatial_merge_size, vcfg.grid_side, segment_align(vcfg)
    taps, weights, rows_cols, segment, slot = [], [], [], [], []
    start = 0

    def axis(index: np.ndarray, size: int):
        # index*(side-1)/(size-1) in float32, as the reference computes it.
        src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        lo = np.floor(src)
        frac = (src - lo).astype(np.float32)
        lo = lo.astype(np.int64)
        return (np.stack([lo, np.minimum(lo + 1, side - 1)], -1),
                np.stack([np.float32(1) - frac, frac], -1))

    for t, h, w in grid.tolist():
        r = np.arange(h).reshape(h // m, m, 1, 1)
        c = np.arange(w).reshape(1, 1, w // m, m)
        rows = np.broadcast_to(r, (h // m, m, w // m, m)).transpose(0, 2, 1, 3).reshape(-1)
        cols = np.broadcast_to(c, (h // m, m, w // m, m)).transpose(0, 2, 1, 3).reshape(-1)
        (hi, hw), (wi, ww) = axis(rows, h), axis(cols, w)
        frame_taps = (hi[:, :, None] * side + wi[:, None, :]).reshape(-1, 4)
        frame_weights = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        for _ in range(t):
            taps.append(frame_taps)
            weights.append(frame_weights)
            rows_cols.append(np.stack([rows, cols], -1))
            segment.append(np.full(h * w, len(segment)))
            slot.append(start + np.arange(h * w))
            start += -(-h * w // align) * align
    return {"taps": np.concatenate(taps).astype(np.int32), "weights": np.concatenate(weights).astype(np.float32),
            "rows_cols": np.concatenate(rows_cols).astype(np.int32),
            "segment": np.concatenate(segment).astype(np.int32), "slot": np.concatenate(slot)}


def segment_align(vcfg: VisionConfig) -> int:
    """Rows a segment's start is aligned to: KEY_CHUNK, and whole merge blocks."""
    return math.lcm(KEY_CHUNK, vcfg.merge_unit)


def laid_out_patches(vcfg: VisionConfig, grid: np.ndarray) -> int:
    """Rows of the laid-out call: each segment (temporal patch of an image) rounded up to
    `segment_align`."""
    align = segment_align(vcfg)
    return int(sum(t * (-(-h * w // align) * align) for t, h, w in np.asarray(grid).tolist()))


# ---- the forward ------------------------------------------------------------------------

def _linear(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """x `[N, K]` @ w `[K, N']` + b: one native product (not `layers.matmul`'s 8-row blocks,
    whose bits differ from a native product's: see the module docstring)."""
    if w.dtype == jnp.float32:
        y = jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST)
    else:
        y = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32).astype(w.dtype)
    return y + b.astype(y.dtype)


def _layer_norm(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    n = x.shape[-1]
    mean = (tree_sum(x32) / n)[..., None]
    centred = x32 - mean
    var = (tree_sum(centred * centred) / n)[..., None]
    y = centred * jax.lax.rsqrt(var + LN_EPS) * w.astype(jnp.float32) + b.astype(jnp.float32)
    return y.astype(x.dtype)


def _gelu(x: jax.Array, tanh: bool) -> jax.Array:
    return jax.nn.gelu(x.astype(jnp.float32), approximate=tanh).astype(x.dtype)


def _einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """float32 result; float32 operands at HIGHEST, narrow ones as stored."""
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.einsum(spec, a, b, precision=precision, preferred_element_type=jnp.float32)


def _rotary(vcfg: VisionConfig, rows_cols: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin `[N, head_dim]` float32: head_dim/4 frequencies of the row, then of the column,
    the whole repeated twice."""
    half = vcfg.head_dim // 2
    inv_freq = 1.0 / (vcfg.rope_theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    freqs = rows_cols.astype(jnp.float32)[..., None] * inv_freq  # [N, 2, head_dim/4]
    freqs = freqs.reshape(freqs.shape[0], -1)
    freqs = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(freqs), jnp.sin(freqs)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).astype(x.dtype)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, segment: jax.Array) -> jax.Array:
    """Block-diagonal attention: q, k, v `[N, h, d]`, a patch attends to the patches of its own
    segment only → float32 `[N, h, d]`.

    The keys run in chunks of KEY_CHUNK (zero-padded, masked), each a product of its own with a
    fixed size, and the chunks' partial outputs are summed as a tree: the rounding of XLA's CPU
    dot depends on its key (output or contraction) length, so this keeps every length fixed,
    and the keys a padded call adds (probability exactly 0) leave a patch's result unchanged."""
    n, heads, d = k.shape
    chunks = -(-n // KEY_CHUNK)
    extra = chunks * KEY_CHUNK - n
    by_chunk = lambda t: jnp.pad(t, ((0, extra), (0, 0), (0, 0))).reshape(chunks, KEY_CHUNK, heads, d)  # noqa: E731
    key_segment = jnp.pad(segment, (0, extra), constant_values=-1).reshape(chunks, KEY_CHUNK)
    scores = _einsum("qhd,ckhd->hqck", q, by_chunk(k)) * (d ** -0.5)
    mask = segment[:, None, None] == key_segment[None]
    scores = jnp.where(mask[None], scores, -jnp.inf).reshape(heads, n, chunks * KEY_CHUNK)
    probs = softmax(scores).astype(v.dtype).reshape(heads, n, chunks, KEY_CHUNK)
    # Output laid out batch dims first ([c, h] then [q, d]): with the q axis ahead of h, XLA's
    # CPU dot rounded a row differently at another q count.
    return tree_sum(_einsum("hqck,ckhd->chqd", probs, by_chunk(v)), axis=0).transpose(1, 0, 2)


def _block(p: dict, x: jax.Array, vcfg: VisionConfig, cos, sin, segment) -> jax.Array:
    n, heads, d = x.shape[0], vcfg.num_heads, vcfg.head_dim
    h = _layer_norm(x, p["norm1_weight"], p["norm1_bias"])
    qkv = _linear(h, p["qkv"], p["qkv_bias"]).reshape(n, 3, heads, d)
    q, k, v = _rope(qkv[:, 0], cos, sin), _rope(qkv[:, 1], cos, sin), qkv[:, 2]
    o = _attention(q, k, v, segment).astype(x.dtype).reshape(n, heads * d)
    x = x + _linear(o, p["proj"], p["proj_bias"])
    h = _layer_norm(x, p["norm2_weight"], p["norm2_bias"])
    h = _gelu(_linear(h, p["fc1"], p["fc1_bias"]), _ACTIVATIONS[vcfg.hidden_act])
    return x + _linear(h, p["fc2"], p["fc2_bias"])


# Times `_forward` was traced (a compilation each, through `jax.jit`): tests read it.
TRACES = {"count": 0}


def _forward(params: dict, patches: jax.Array, taps: jax.Array, weights: jax.Array,
             rows_cols: jax.Array, segment: jax.Array, vcfg: VisionConfig) -> jax.Array:
    """`patches` `[N, C*T*P*P]` in merge-block order (N a multiple of merge_unit) → `[N/unit, out]`."""
    TRACES["count"] += 1
    dtype = params["pos_embed"].dtype
    x = _linear(patches.astype(dtype), params["patch_embed"], params["patch_embed_bias"])
    table = params["pos_embed"].astype(jnp.float32)
    pos = table[taps[:, 0]] * weights[:, 0:1]
    for j in range(1, 4):
        pos = pos + table[taps[:, j]] * weights[:, j:j + 1]
    x = x + pos.astype(dtype)
    cos, sin = _rotary(vcfg, rows_cols)
    for p in params["blocks"]:
        x = _block(p, x, vcfg, cos, sin, segment)
    m = params["merger"]
    x = _layer_norm(x, m["norm_weight"], m["norm_bias"]).reshape(-1, vcfg.merge_unit * vcfg.hidden_size)
    x = _gelu(_linear(x, m["fc1"], m["fc1_bias"]), False)
    return _linear(x, m["fc2"], m["fc2_bias"])


_forward_jit = jax.jit(_forward, static_argnames=("vcfg",))


def _prepare(vcfg: VisionConfig, pixel_values, grid: np.ndarray, pad_to: int):
    """The patches laid out in `pad_to` rows (`patch_layout`'s slots), the layout's arrays and
    the rows of the real tokens. Padding rows: zero pixels and position weights, one attention
    segment of their own (they attend among themselves, never to an image's patches nor an
    image's to them), dropped from the result."""
    n = _total(grid)
    if not isinstance(pixel_values, jax.Array):
        pixel_values = np.asarray(pixel_values)
    if pixel_values.ndim != 2 or tuple(pixel_values.shape) != (n, vcfg.patch_dim):
        raise RequestError(f"pixel_values: expected shape ({n}, {vcfg.patch_dim}) for grid_thw "
                           f"{grid.tolist()}, got {tuple(pixel_values.shape)}")
    layout = patch_layout(vcfg, grid)
    slot = layout.pop("slot")
    padded = {"taps": np.zeros((pad_to, 4), np.int32), "weights": np.zeros((pad_to, 4), np.float32),
              "rows_cols": np.zeros((pad_to, 2), np.int32),
              "segment": np.full(pad_to, layout["segment"].max() + 1, np.int32)}
    for key, value in layout.items():
        padded[key][slot] = value
    if isinstance(pixel_values, jax.Array):
        pixels = jnp.zeros((pad_to, vcfg.patch_dim), pixel_values.dtype).at[slot].set(pixel_values)
    else:
        pixels = np.zeros((pad_to, vcfg.patch_dim), pixel_values.dtype)
        pixels[slot] = pixel_values
    return pixels, padded, slot[::vcfg.merge_unit] // vcfg.merge_unit


def encode(params: dict, vcfg: VisionConfig, pixel_values, grid_thw) -> jax.Array:
    """Image and video patches → merged tokens `[total_patches / merge_unit, out_hidden_size]`
    (each image's tokens in turn, in grid_thw's order), compiled for this call's laid-out rows
    (`laid_out_patches`, at least MIN_TOKENS tokens).

    `pixel_values` `[total_patches, C*T*P*P]` as the reference processor produces it (each
    image's patches in merge-block order), `grid_thw` `[num_images, 3]` (static, Host ints)."""
    grid = check_grid(vcfg, grid_thw)
    return _run(params, vcfg, pixel_values, grid, max(laid_out_patches(vcfg, grid), MIN_TOKENS * vcfg.merge_unit))


def bucket_patches(vcfg: VisionConfig, rows: int) -> int:
    """The padded row count `encode_bucketed` compiles for, for `rows` laid-out rows:
    merge_unit times the next power of two of the merged tokens, at least MIN_TOKENS tokens."""
    tokens = -(-rows // vcfg.merge_unit)
    return vcfg.merge_unit * max(MIN_TOKENS, next_pow2(tokens))


def encode_bucketed(params: dict, vcfg: VisionConfig, pixel_values, grid_thw, executable=None) -> jax.Array:
    """`encode`, padded to `bucket_patches(laid_out_patches)` rows: one compilation per bucket
    (per power of two of the call's laid-out rows over all its images), whatever the grids.
    What is bucketed is that total only; the grids, the number of images and the temporal
    patches are data. Padding never changes an image's tokens; the price is up to 2x rows and,
    with the dense block-diagonal attention, up to 4x attention work and memory.

    `executable(rows)`: the compiled tower of a bucket (`lower_bucket`, compiled by the caller,
    e.g. the engine's `CompiledSteps.tower`, which counts and announces it), and the tokens come
    back as a Host numpy array (nothing compiles for a new image size); None: `jax.jit`'s own
    cache, a device array."""
    grid = check_grid(vcfg, grid_thw)
    return _run(params, vcfg, pixel_values, grid, bucket_patches(vcfg, laid_out_patches(vcfg, grid)), executable)


def warm_buckets(vcfg: VisionConfig, max_tokens: int) -> list[int]:
    """The bucket row counts (`bucket_patches`) a call of one image of at most `max_tokens`
    merged tokens can take: merge_unit x every power of two from MIN_TOKENS to the one that
    holds `max_tokens` (an image is one segment, so its laid-out rows round its patches up to
    `segment_align` only, and that never passes the power of two of its tokens)."""
    top = bucket_patches(vcfg, max(1, max_tokens) * vcfg.merge_unit)
    rows, out = bucket_patches(vcfg, 1), []
    while rows <= top:
        out.append(rows)
        rows *= 2
    return out


def lower_bucket(params: dict, vcfg: VisionConfig, rows: int):
    """The tower of one bucket of `rows` laid-out patch rows, lowered (`jax.stages.Lowered`) for
    float32 pixel values and the params' shapes and dtypes; its compiled form is what
    `encode_bucketed(..., executable=)` runs. Only shapes are read: nothing runs."""
    spec = jax.ShapeDtypeStruct
    return _forward_jit.lower(params, spec((rows, vcfg.patch_dim), jnp.float32), spec((rows, 4), jnp.int32),
                              spec((rows, 4), jnp.float32), spec((rows, 2), jnp.int32), spec((rows,), jnp.int32),
                              vcfg=vcfg)


def _total(grid: np.ndarray) -> int:
    return int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())


def _run(params: dict, vcfg: VisionConfig, pixel_values, grid: np.ndarray, pad_to: int, executable=None) -> jax.Array:
    pixels, layout, tokens = _prepare(vcfg, pixel_values, grid, pad_to)
    if executable is None:
        return _forward_jit(params, pixels, **layout, vcfg=vcfg)[tokens]
    pixels = pixels.astype(jnp.float32) if isinstance(pixels, jax.Array) else np.asarray(pixels, np.float32)
    out = executable(pad_to)(params, pixels, layout["taps"], layout["weights"], layout["rows_cols"], layout["segment"])
    # The real tokens picked on the Host: an eager gather would compile anew for each token count.
    return np.asarray(out)[tokens]
