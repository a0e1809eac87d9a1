"""Which ratio and which constraints a plan is built from (DESIGN rule 4)."""

from __future__ import annotations

import pytest

from kvpool import presets
from kvpool.errors import LimitsError
from kvpool.plan import ServingLimits, plan_pools, typical_step
from kvpool.spec import Shape, load_model_spec
from plan_helpers import assert_holds, hybrid

GiB = 2**30


def test_typical_step_has_the_exact_shapes() -> None:
    # B=3, L=1024, N=2048, d=2, S=1024: one context of N = 2048 positions,
    # then B - 1 = 2 decodes at S with history S - d - 1 = 1021.
    limits = ServingLimits(max_batch_size=3, max_seq_len=1024, max_num_tokens=2048, max_draft_len=2)
    assert typical_step(limits, 1024) == (Shape(2048, 0), Shape(1024, 1021), Shape(1024, 1021))


def test_extra_kv_tokens_are_in_the_context_entry() -> None:
    # E = 2, N = 256: the typical step's context request holds 256 + 2 = 258 positions;
    # the context floor is the engine's context warmup, which also holds the first
    # generated token and d = 2 drafts: 256 + 1 + 2 + 2 = 261.
    limits = ServingLimits(
        max_batch_size=3, max_seq_len=1024, max_num_tokens=256, max_draft_len=2, num_extra_kv_tokens=2, avg_seq_len=1024
    )
    plan = plan_pools(hybrid(), limits, kv_memory_bytes=GiB)
    assert plan.typical_step is not None and plan.typical_step[0] == Shape(258, 0)
    assert [(c.name, c.batch) for c in plan.constraints] == [("context", (Shape(261, 0),))]


def test_without_max_num_tokens_the_context_entry_is_s() -> None:
    limits = ServingLimits(max_batch_size=2, max_seq_len=1024, max_num_tokens=None, num_extra_kv_tokens=1)
    assert typical_step(limits, 512) == (Shape(513, 0), Shape(512, 511))


def test_default_path_has_no_typical_step_and_no_constraints() -> None:
    plan = plan_pools(hybrid(), ServingLimits(max_seq_len=8192), kv_memory_bytes=GiB)
    assert plan.policy == "reference"
    assert plan.typical_step is None
    assert plan.constraints == ()
    # Reference request (2049, 2048), tpb 32, W 1024, equal row bytes:
    # full ceil(2049/32) = 65 pages; sliding 65 - floor((2048 + 1 - 1024)/32) = 65 - 32 = 33.
    assert plan.ratio["full"] == pytest.approx(65 / 98)
    assert plan.ratio["sliding"] == pytest.approx(33 / 98)


def test_avg_seq_len_builds_the_typical_step_and_context_constraint() -> None:
    limits = ServingLimits(max_batch_size=3, max_seq_len=1024, max_num_tokens=2048, max_draft_len=2, avg_seq_len=1024)
    plan = plan_pools(hybrid(), limits, kv_memory_bytes=GiB)
    assert plan.policy == "typical_step"
    assert plan.typical_step == (Shape(2048, 0), Shape(1024, 1021), Shape(1024, 1021))
    # the context floor: N = 2048 prompt tokens, the first generated token, d = 2 drafts
    assert [(c.name, c.batch, c.satisfied) for c in plan.constraints] == [("context", (Shape(2051, 0),), True)]
    # Typical step pages: full 64 + 32 + 32 = 128; sliding: context 64, each decode
    # 32 - floor((1021 + 1 - 1024)/32) = 32 - 0 = 32 (window not yet passed) -> 128.
    assert plan.ratio == pytest.approx({"full": 0.5, "sliding": 0.5})
    assert_holds(plan, [Shape(2051, 0)], "context constraint")


def test_avg_seq_len_above_max_seq_len_fails_only_when_given() -> None:
    with pytest.raises(LimitsError, match="avg_seq_len 1025 exceeds max_seq_len 1024"):
        ServingLimits(max_seq_len=1024, avg_seq_len=1025)
    ServingLimits(max_seq_len=1024)  # no S: nothing to check
    ServingLimits(max_seq_len=1024, avg_seq_len=1024)


def test_explicit_pool_ratio_drops_every_constraint() -> None:
    limits = ServingLimits(max_batch_size=4, max_seq_len=4096, max_num_tokens=2048, avg_seq_len=2048)
    plan = plan_pools(hybrid(), limits, kv_memory_bytes=GiB, pool_ratio={"full": 0.25, "sliding": 0.75})
    assert plan.policy == "pool_ratio"
    assert plan.constraints == () and plan.typical_step is None
    # 1 GiB, 32 KiB pages: 0.25 GiB = 8192 pages, 0.75 GiB = 24576 pages, nothing left over.
    assert (plan.pages("full"), plan.pages("sliding")) == (8192, 24576)


@pytest.mark.parametrize(
    "bad",
    [
        {"full": 0.5},
        {"full": 0.5, "sliding": 0.4},
        {"full": 0.0, "sliding": 1.0},
        {"full": 1.0, "sliding": 0.0, "x": 0.0},
    ],
)
def test_bad_pool_ratio_is_a_limits_error(bad: dict[str, float]) -> None:
    with pytest.raises(LimitsError):
        plan_pools(hybrid(), ServingLimits(), kv_memory_bytes=GiB, pool_ratio=bad)


def dsv4_limits(**kw: int) -> ServingLimits:
    base = {"max_batch_size": 4, "max_seq_len": 4096, "max_num_tokens": 2048}
    return ServingLimits(**{**base, **kw})  # type: ignore[arg-type]


def test_deepseek_v4_falls_back_to_s_equal_l() -> None:
    spec = load_model_spec("deepseek-v4-flash")
    plan = plan_pools(spec, dsv4_limits(max_draft_len=1), kv_memory_bytes=20 * GiB)
    assert plan.avg_seq_len == 4096
    # One context of N = 2048, then B - 1 = 3 decodes at S = L with history 4096 - 1 - 1.
    assert plan.typical_step == (Shape(2048, 0),) + (Shape(4096, 4094),) * 3
    explicit = plan_pools(spec, dsv4_limits(avg_seq_len=256), kv_memory_bytes=20 * GiB)
    assert explicit.avg_seq_len == 256


def test_deepseek_v4_longest_decode_constraint_includes_draft_and_extra_tokens() -> None:
    spec = load_model_spec("deepseek-v4-flash")
    plan = plan_pools(spec, dsv4_limits(max_draft_len=2, num_extra_kv_tokens=3), kv_memory_bytes=20 * GiB)
    by_name = {c.name: c for c in plan.constraints}
    assert set(by_name) == {"context", "longest_decode"}
    # Context: the context warmup, N + 1 + d + E = 2048 + 1 + 2 + 3. Longest decode: the warmup dummy of L tokens,
    # capacity L + d + E = 4096 + 2 + 3 and history L - 1, plus B - 1 = 3 minimal
    # decodes of 1 + d + E = 1 + 2 + 3 = 6 positions, no history.
    assert by_name["context"].batch == (Shape(2054, 0),)
    assert by_name["longest_decode"].batch == (Shape(4101, 4095),) + (Shape(6, 0),) * 3
    for c in plan.constraints:
        assert_holds(plan, c.batch, c.name)


def test_deepseek_v4_explicit_ratio_also_drops_its_floors() -> None:
    spec = load_model_spec("deepseek-v4-flash")
    share = 1 / len(spec.groups)
    plan = plan_pools(spec, dsv4_limits(), kv_memory_bytes=20 * GiB, pool_ratio={n: share for n in spec.group_names})
    assert plan.constraints == ()


@pytest.mark.parametrize("name", [n for n in presets.model_names() if "v4" not in n])
def test_generic_models_never_get_the_longest_decode_constraint(name: str) -> None:
    spec = load_model_spec(name)
    limits = ServingLimits(max_batch_size=8, max_seq_len=4096, max_num_tokens=1024, avg_seq_len=1024)
    plan = plan_pools(spec, limits, kv_memory_bytes=64 * GiB)
    assert [c.name for c in plan.constraints] == ["context"]
    profile = plan_pools(spec, limits, kv_memory_bytes=64 * GiB, phase="profile")
    assert [c.name for c in profile.constraints] == ["warmup_context", "warmup_batch", "graph_longest"]
