"""The functional resource ledger (a functional core; the Program is the imperative shell).

Pure Python, immutable state, no JAX/numpy. Every change is a pure planner returning a
`Plan` (diff, proof, preconditions) or a `Refusal` with the exact shortfall per pool;
`commit(state, plan)` applies a plan in one step or raises `StalePlan`. The Program's
stores (`ninfer_jax.program`) apply the same plans and move the bytes. See docs/ledger.md.
"""
from ledger.arena import HostAllocation, HostArena, HostShortfall
from ledger.capacity import (
    PAGE_TOKENS,
    DeviceBudget,
    check_device_fit,
    check_kv_pages,
    default_host_capacity_bytes,
    kv_page_range,
    pages_for_tokens,
    resolve_kv_pages,
    solve_kv_pages,
    state_slot_count,
)
from ledger.errors import (
    AlreadyHolder,
    ArenaError,
    CapacityConfigError,
    ExceedsCapacity,
    IntegrityError,
    InvalidRequest,
    LedgerError,
    NotAHolder,
    PermitOverdraw,
    ReplicaError,
    StaleGeneration,
    StalePlan,
    TransactionStateError,
    UnknownLease,
    UnknownObject,
    UnknownPermit,
)
from ledger.effects import CopyToDevice, CopyToHost, CopyUnit
from ledger.integrity import Recount, check_integrity
from ledger.objects import (
    plan_add_holders,
    plan_allocate,
    plan_copy_on_write,
    plan_drop_holders,
    plan_drop_replica,
    plan_lease,
    plan_pin,
    plan_release_leases,
    plan_unpin,
)
from ledger.ops import Precondition
from ledger.permits import UnitDemand, plan_cycle_permits, plan_settle, plan_settle_all, plan_unit_permit
from ledger.plan import Plan, Proof, Refusal, Shortfall, commit
from ledger.state import (
    DEVICE,
    HOST,
    HOST_MEDIUM,
    KV_PAGE,
    KV_PAGES,
    MAIN_KV,
    STATE_IMAGE,
    STATE_POOL,
    STATE_SLOTS,
    CopyJob,
    DevicePool,
    LedgerConfig,
    LedgerState,
    PhysicalObject,
    PoolSpec,
    ReaderLease,
    RecoveryPermit,
    Replica,
    Transaction,
    TxnKind,
    TxnPhase,
    UnitKind,
    UnitPermit,
    initial_state,
)
from ledger.transactions import (
    TransferRequest,
    plan_begin_transfer,
    plan_cancel,
    plan_complete,
    plan_publish,
    plan_submit,
)
from ledger.usage import usage

__all__ = [name for name in dir() if not name.startswith("_")]

# -- the context-cache policy (records, checkpoints, index, evidence, reclamation; docs/cache_policy.md)
from ledger.bind import BindRequest, plan_bind, plan_bind_transfer
from ledger.reclamation.edit import CacheResult
from ledger.cache_integrity import check_cache, check_quote
from ledger.cache_state import (
    ActiveUse,
    CacheState,
    Checkpoint,
    ContinuationRecord,
    CostModel,
    InputKind,
    PointKind,
    SharedEntry,
    Tier,
    WaitRef,
    ckpt_holder,
    empty_cache,
    seq_holder,
    wait_holder,
)
from ledger.capture import (
    CaptureRequest,
    SequenceView,
    plan_cancel_paused,
    plan_capture,
    plan_clear,
    plan_pause,
    plan_publish_end,
    plan_revoke_snapshot,
)
from ledger.reclamation.demand import observe_prefill, rebalance_tiers
from ledger.identity import InputIdentity, extend, from_frontier_identity, identity_of
from ledger.reclamation import (Applicant, ApplicantKind, Gap, Quote, gap_order, plan_reclaim, quote, quote_facts,
                            quote_reference)
from ledger import reclamation
from ledger.sources import SourceCandidate, SourceQuery, Takeover, query_sources, select_source
from ledger.waiting import plan_release_wait, plan_revoke_wait, plan_wait, revocable_waiters

__all__ = [name for name in dir() if not name.startswith("_")]
