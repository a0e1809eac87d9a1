"""`kvpool inspect MODEL`: the layer groups of a model's KV cache."""

from __future__ import annotations

import argparse
from typing import Any

from kvpool.cli.common import add_json_arg, add_model_args, print_json, say_fallback, table
from kvpool.deploy.budget import weights_facts
from kvpool.deploy.options import ModelOptions
from kvpool.deploy.resolution import model_spec
from kvpool.spec import ModelSpec
from kvpool.units import format_bytes


def register(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="show the layer groups (pools) of a model's KV cache",
        description="Show which pool groups a model's KV cache splits into and their bytes.",
    )
    add_model_args(p)
    add_json_arg(p)
    p.set_defaults(func=run)


def inspect_json(spec: ModelSpec, parameters: int | None = None, weights_bytes: int | None = None) -> dict[str, Any]:
    return {
        "model": spec.name,
        "source": None if spec.source is None else spec.source.to_json(),
        "kv_dtype": spec.kv_dtype,
        "kv_dtype_note": spec.kv_dtype_note,
        "tp_size": spec.tp_size,
        "pp_stage": None if spec.pp_stage is None else list(spec.pp_stage),
        "tokens_per_block": spec.tokens_per_block,
        "groups": [
            {
                "name": g.name,
                "kind": g.kind,
                "window": g.window,
                "ratio": g.ratio,
                "num_layers": len(g.layers),
                "page_bytes": g.page_bytes,
                "bytes_per_request": g.state_bytes,
            }
            for g in spec.groups
        ],
        "full_attention_bytes_per_token": spec.full_attention_bytes_per_token,
        "parameters": parameters,
        "weights_bytes": weights_bytes,
    }


def run(args: argparse.Namespace) -> int:
    model = ModelOptions(args.model, args.kv_dtype, args.tp, args.pp, args.ep, args.dp, args.tokens_per_block)
    spec = model_spec(model)  # refuses a tp that does not divide the heads, as plan does (vLLM does)
    say_fallback(spec)
    parameters, weights_bytes = weights_facts(spec, model)
    if args.json:
        print_json(inspect_json(spec, parameters, weights_bytes))
        return 0
    print(render(spec, parameters, weights_bytes))
    return 0


def render(spec: ModelSpec, parameters: int | None, weights_bytes: int | None) -> str:
    """The spec as text: where it comes from, its pool groups, the full-attention bytes, the weights."""
    lines = [
        f"{spec.name}  ({spec.family}, kv {spec.kv_dtype}, tp {spec.tp_size}, "
        f"{spec.tokens_per_block} tokens per page, {spec.num_layers} layers)"
    ]
    if spec.source is not None:
        lines.append(f"source: {spec.source.describe()}")
    if spec.pp_stage is not None:
        index, stages = spec.pp_stage
        layers = sorted(i for g in spec.groups for i in g.layers)
        lines.append(
            f"pipeline stage {index} of {stages} (layers {layers[0]}..{layers[-1]}): "
            "the stage with the most KV bytes per reference request"
        )
    if spec.kv_dtype_note:
        lines.append(f"note: {spec.kv_dtype_note}")
    lines.append(groups_table(spec))
    lines.append(f"full-attention bytes per token: {spec.full_attention_bytes_per_token:,}")
    if weights_bytes is not None:
        count = f"{parameters / 1e9:.2f}B parameters, " if parameters else ""
        lines.append(f"weights: {count}{format_bytes(weights_bytes)} per rank at tp {spec.tp_size}")
    return "\n".join(lines)


def groups_table(spec: ModelSpec) -> str:
    rows = []
    for g in spec.groups:
        slot = g.rule.per_request  # one slot per request instead of pages of positions
        rows.append(
            [
                g.name,
                g.kind,
                g.rule.describe(g),
                len(g.layers),
                "-" if slot else f"{g.bytes_per_token:,.1f}",
                "-" if slot else f"{g.page_bytes:,}",
                format_bytes(g.state_bytes) if slot else "-",
            ]
        )
    return table(["group", "kind", "life cycle", "layers", "bytes/token", "bytes/page", "state/request"], rows)
