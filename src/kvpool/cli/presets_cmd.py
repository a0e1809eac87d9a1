"""`kvpool models` and `kvpool gpus`: the bundled presets."""

from __future__ import annotations

import argparse
from typing import Any

from kvpool import presets
from kvpool.cli.common import add_json_arg, print_json, table
from kvpool.spec import load_model_spec
from kvpool.units import format_bytes


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="list bundled model presets")
    add_json_arg(p)
    p.set_defaults(func=run_models)
    p = sub.add_parser("gpus", help="list bundled GPU presets")
    add_json_arg(p)
    p.set_defaults(func=run_gpus)


def run_models(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for name in presets.model_names():
        spec = load_model_spec(name)
        rows.append(
            {
                "name": name,
                "family": spec.family,
                "kv_dtype": spec.kv_dtype,
                "groups": [f"{g.name}:{g.kind}" for g in spec.groups],
                "full_attention_bytes_per_token": spec.full_attention_bytes_per_token,
                "max_position_embeddings": spec.max_position_embeddings,
            }
        )
    if args.json:
        print_json({"models": rows})
    else:
        print(
            table(
                ["model", "family", "groups", "max positions"],
                [[r["name"], r["family"], " ".join(r["groups"]), r["max_position_embeddings"]] for r in rows],
            )
        )
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    gpus = [presets.load_gpu(n) for n in presets.gpu_names()]
    if args.json:
        print_json(
            {
                "gpus": [
                    {
                        "name": g.key,
                        "model": g.name,
                        "memory_bytes": g.memory_bytes,
                        "memory_source": g.memory_source,
                        "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s,
                        "bf16_flops": g.bf16_flops,
                        "fp8_flops": g.fp8_flops,
                    }
                    for g in gpus
                ]
            }
        )
    else:
        print(
            table(
                ["gpu", "model", "memory", "HBM TB/s", "BF16 TFLOPS", "FP8 TFLOPS"],
                [
                    [
                        g.key,
                        g.name,
                        format_bytes(g.memory_bytes),
                        f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
                        f"{g.bf16_flops / 1e12:.0f}",
                        f"{g.fp8_flops / 1e12:.0f}" if g.fp8_flops else "-",
                    ]
                    for g in gpus
                ],
            )
        )
    return 0
