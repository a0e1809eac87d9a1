"""`simulate` for a fleet: N replicas of one engine behind a router, or prefill
and decode replicas with the handoff between them (`kvpool simulate
--replicas/--router` or `--prefill-replicas/--decode-replicas`).

A `FleetSimulation` is one replica's set-up (`deploy.Simulation`: the plan
request resolved, one rank's step times, the trace at its rate; one policy)
and a `FleetLayout`. Every replica runs the same plan with its own manager and
scheduler (`kvpool.sim.Replica`), the fleet's loop is `kvpool.fleet.loop`. A
disaggregated fleet is run beside the aggregated fleet of as many GPUs (the same
router), and the verdict says which serves more: "aggregated wins" where it does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Unpack

from kvpool.deploy.simulation import SimulateKeywords, Simulation
from kvpool.errors import KvpoolError, flagged
from kvpool.fleet import ROUTER_NAMES, handoff, handoff_link, make_router
from kvpool.fleet.handoff import handoff_seconds
from kvpool.fleet.loop import FleetReplica, Handoffs, Stage, Transfer, run_fleet
from kvpool.fleet.metrics import FleetResult, Slo
from kvpool.fleet.replicas import make_replica
from kvpool.fleet.routers import Router
from kvpool.plan import PoolPlan
from kvpool.units import is_positive_int


@dataclass(frozen=True)
class FleetLayout:
    """`replicas` aggregated replicas, or `prefill` + `decode` replicas (both > 0),
    each of one engine of `tp` GPUs; `router` picks the replica (the prefill
    replica when disaggregated; the decode replica by the same rule on the
    decode replicas' own caches); the kv router reads events `event_lag_ms`
    late; `link` the handoff's link (default: the GPU's own scale-up link)."""

    replicas: int = 1
    router: str = "round-robin"
    event_lag_ms: float = 0.0
    prefill: int = 0
    decode: int = 0
    tp: int = 1
    link: str | None = None

    def __post_init__(self) -> None:
        if self.router not in ROUTER_NAMES:
            raise KvpoolError(f"--router {self.router!r}: one of {', '.join(ROUTER_NAMES)}")
        self._check_replicas()
        self._check_event_lag()
        if self.link is not None and not self.disaggregated:
            raise KvpoolError("--link is the prefill -> decode handoff's; add --prefill-replicas/--decode-replicas")

    def _check_replicas(self) -> None:
        """The replica counts: aggregated (--replicas) or prefill and decode, not both."""
        if not is_positive_int(self.replicas):
            raise KvpoolError(f"--replicas must be a positive integer, got {self.replicas!r}")
        if (self.prefill > 0) != (self.decode > 0):
            raise KvpoolError("a disaggregated fleet needs both --prefill-replicas and --decode-replicas")
        if self.disaggregated and self.replicas != 1:
            raise KvpoolError("give --replicas or --prefill-replicas/--decode-replicas, not both")

    def _check_event_lag(self) -> None:
        """The event lag: not negative, and only for the kv router that reads events."""
        if not self.event_lag_ms >= 0:
            raise KvpoolError(f"--event-lag-ms must not be negative, got {self.event_lag_ms}")
        if self.event_lag_ms and not self.router.startswith("kv"):
            raise KvpoolError(
                f"--event-lag-ms delays the KV events the kv router reads; router {self.router} reads none"
            )

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def engines(self) -> int:
        return self.prefill + self.decode if self.disaggregated else self.replicas

    @property
    def gpus(self) -> int:
        return self.engines * self.tp

    @property
    def label(self) -> str:
        tp = f" x tp{self.tp}"
        size = f"{self.prefill}P:{self.decode}D" if self.disaggregated else f"{self.replicas}"
        return f"{size}{tp}, {self.router}"

    def aggregated(self) -> FleetLayout:
        """The aggregated fleet of as many GPUs, the same router."""
        return FleetLayout(self.engines, self.router, self.event_lag_ms, tp=self.tp)


@dataclass(frozen=True)
class FleetRun:
    """A fleet's run, and for a disaggregated one the aggregated run beside it
    and the verdict."""

    layout: FleetLayout
    result: FleetResult
    aggregated: FleetResult | None = None
    notes: tuple[str, ...] = ()

    @property
    def verdict(self) -> str | None:
        """For a disaggregated run: which layout serves more good requests per
        second (all finished ones without an SLO), aggregated on a tie."""
        if self.aggregated is None:
            return None
        agg, dis = self.aggregated.goodput(), self.result.goodput()
        what = "goodput" if self.result.slo is not None else "requests/s"
        if agg >= dis:
            return f"aggregated wins: {agg:.3g} vs {dis:.3g} {what} on {self.layout.gpus} GPUs"
        return f"disaggregated wins: {dis:.3g} vs {agg:.3g} {what} on {self.layout.gpus} GPUs"

    def to_dict(self) -> dict[str, Any]:
        out = self.result.to_dict()
        if self.aggregated is not None:
            out["aggregated"] = self.aggregated.to_dict()
            out["verdict"] = self.verdict
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class FleetSimulation:
    """One replica's set-up and the fleet's layout (module docstring)."""

    simulation: Simulation
    layout: FleetLayout
    slo: Slo | None = None

    @classmethod
    def of(
        cls,
        model: str,
        *,
        gpu: str,
        trace: Any,
        layout: FleetLayout,
        slo: Slo | str | None = None,
        **options: Unpack[SimulateKeywords],
    ) -> FleetSimulation:
        """The fleet's set-up: `simulate`'s keywords for one replica (one policy;
        no sweep, no cold tiers), `layout`, `slo` (`ttft_p99=2s,itl_p99=50ms`)."""
        for key in ("compare", "sweep_ratio", "host_memory", "disk"):
            if options.get(key):
                raise KvpoolError(f"a fleet runs one policy on GPU pools: drop --{key.replace('_', '-')}")
        if options.get("policy") in ("rebalance", "online"):
            raise KvpoolError(f"a fleet runs static splits: drop --policy {options.get('policy')}")
        one = Simulation.of(model, gpu=gpu, trace=trace, **options)
        layout = dataclasses.replace(layout, tp=one.resolved.request.model.tp)
        if layout.disaggregated:
            handoff_link(one.gpu, layout.link)  # an unknown link fails before any run
        with flagged("--slo"):
            parsed = Slo.parse(slo) if isinstance(slo, str) else slo
        return cls(one, layout, parsed)

    @property
    def plan(self) -> PoolPlan:
        return self.simulation.plan(self.simulation.policies[0], with_model=True).plan

    def run(self, progress: Callable[[int, int], None] | None = None) -> FleetRun:
        """Run the fleet (and the aggregated fleet beside a disaggregated one)."""
        plan = self.plan
        notes = [f"step times: calibration {self.simulation.model.calibration} (--calibration; docs/sim.md)"]
        result = self.run_layout(self.layout, plan, progress)
        if not self.layout.disaggregated:
            return FleetRun(self.layout, result, None, tuple(notes))
        link = handoff_link(self.simulation.gpu, self.layout.link)
        notes.append(
            f"handoff over {link.name} ({link.bytes_per_s / 1e9:g} GB/s per direction, one rank's shard per link); "
            "decode replicas allocate a handed-off prompt's pages and charge its first token as a decode row"
        )
        aggregated = self.run_layout(self.layout.aggregated(), plan, progress)
        return FleetRun(self.layout, result, aggregated, tuple(notes))

    def run_layout(
        self, layout: FleetLayout, plan: PoolPlan, progress: Callable[[int, int], None] | None = None
    ) -> FleetResult:
        """One fleet of `layout` on `plan`."""
        sim = self.simulation
        events = layout.router.startswith("kv")

        def stage(role: str, n: int) -> Stage:
            reps: list[FleetReplica] = [
                make_replica(
                    plan,
                    sim.model,
                    role,
                    f"{role}{i}",
                    events=events,
                    reuse=sim.reuse,
                    padding=sim.padding,
                    admission=sim.admission,
                    hash_lookahead=sim.hash_lookahead,
                )
                for i in range(n)
            ]
            return Stage(role, reps, self.router(layout, n, plan))

        handoffs = None
        if layout.disaggregated:
            stages = [stage("prefill", layout.prefill), stage("decode", layout.decode)]
            link = handoff_link(sim.gpu, layout.link)

            def transfer(prompt: int) -> Transfer:
                h = handoff(plan.spec, prompt)
                return Transfer(handoff_seconds(h, link), {g.group: g.slots for g in h.groups})

            handoffs = Handoffs(transfer)
        else:
            stages = [stage("aggregated", layout.replicas)]
        records, summaries = run_fleet(
            sim.trace, stages, max_seq_len=plan.limits.max_seq_len, handoffs=handoffs, progress=progress
        )
        return FleetResult(layout.label, tuple(records), tuple(summaries), layout.gpus, self.slo)

    def router(self, layout: FleetLayout, n: int, plan: PoolPlan) -> Router:
        """`layout`'s router for `n` replicas of `plan` (the kv router on the plan's page size and groups)."""
        if layout.router.startswith("kv"):
            return make_router(
                layout.router,
                n,
                block_size=plan.spec.tokens_per_block,
                event_lag_s=layout.event_lag_ms / 1e3,
                groups=plan.spec.groups,
            )
        if layout.router == "prefix":
            return make_router(layout.router, n, block_size=plan.spec.tokens_per_block)
        return make_router(layout.router, n)


def simulate_fleet(
    model: str,
    *,
    gpu: str,
    trace: Any,
    layout: FleetLayout,
    slo: Slo | str | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Unpack[SimulateKeywords],
) -> FleetRun:
    """Replay `trace` on a fleet of `layout` (replicas of `model` on `gpu`, the
    plan request and step times of `simulate`), each replica with its own
    manager and scheduler behind the layout's router. `slo` sets goodput and
    whether the fleet meets it. Raises KvpoolError on bad input, before any run."""
    return FleetSimulation.of(model, gpu=gpu, trace=trace, layout=layout, slo=slo, **options).run(progress)
