"""The pools a plan sizes: `Capacity`, the counts the Program builds its pools with, and the
backend KV pools a config adds to Main KV (RES-1)."""
from __future__ import annotations

import dataclasses

from ledger import capacity as cap
from ninfer_jax.config import EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Concrete pool sizes a config resolves to for one model."""

    kv_pages: int  # Main KV pages (CFG-2, CFG-6)
    state_slots: int  # C basic + device_state_slots (CFG-4)
    host_capacity_bytes: int  # the Host arena (CFG-5)
    pages_per_request: int  # ceil(max_context / 64): a request's page-table width
    mtp_pages: int = 0  # the MTP backend KV pool's pages (speculative decoding), as many tokens as Main KV


def speculative_pools(config: EngineConfig, model: ModelConfig, itemsize: int) -> tuple[tuple[int, int], ...]:
    """The backend KV pools of `config` (RES-1): with `speculative_tokens`, the MTP layers' K/V in
    64-token pages of their own geometry, as many tokens as the Main KV (spec_steps.MTP_POOL), or
    a DFlash drafter's context K/V likewise (dflash_steps.DFLASH_POOL); else none. A ConfigError
    when the model has no MTP layers, or the drafter does not fit (`drafter_config`)."""
    if not config.speculative_tokens:
        return ()
    if config.speculative_method == "dflash":
        dcfg = drafter_config(config, model)
        return ((cap.PAGE_TOKENS, dcfg.kv_bytes_per_token(itemsize) * cap.PAGE_TOKENS),)
    n = model.mtp_num_hidden_layers
    if not n:
        raise ConfigError("speculative_tokens", f"{config.model} has no MTP head (config mtp_num_hidden_layers "
                                                "is 0): speculative decoding needs one; use 0")
    return ((cap.PAGE_TOKENS, n * 2 * model.num_key_value_heads * model.head_dim * itemsize * cap.PAGE_TOKENS),)


def backend_pool_bytes(kv_pages: int, backend_pools: tuple[tuple[int, int], ...]) -> int:
    """Bytes of the backend pools that go with `kv_pages` Main KV pages (as many tokens each)."""
    return sum(cap.backend_pages(kv_pages, pt) * pb for pt, pb in backend_pools)


def drafter_config(config: EngineConfig, model: ModelConfig):
    """The DFlash drafter of `config` (its config.json only: no weight is read), checked against
    the target `model` and k (issue 35): a ConfigError or CheckpointError naming what is wrong,
    before anything loads."""
    from ninfer_jax.model import dflash

    dcfg, _ = dflash.load_dflash_config(config.draft_model)
    dflash.check_drafter_fits(dcfg, model)
    if config.speculative_tokens > dcfg.block_size - 1:
        raise ConfigError("speculative_tokens", f"{config.speculative_tokens} drafts: the drafter's block of "
                                                f"{dcfg.block_size} positions drafts at most {dcfg.block_size - 1}")
    return dcfg
