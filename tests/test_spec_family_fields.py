"""Every config field a family reads is checked by name (spec/fields.py): the
table lists every field each family's rule reads (recorded here while the rule
runs on a real config of the family), and each field given each bad value of its
domain is refused with a SpecError naming it and the config, or exit 2 with one
line from `kvpool inspect`. The issue's cases: negative or zero heads, zero conv
kernels, fractional head dims, string or null compress_ratios, Jamba offsets past
the period, Nemotron-H patterns longer than the layers, unknown SSM dtypes."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from family_configs import FAMILY_CONFIGS
from kvpool import SpecError, load_model_spec
from kvpool.spec.defaults import with_defaults
from kvpool.spec.dispatch import BY_MODEL_TYPE, family_of
from kvpool.spec.families import Context
from kvpool.spec.fields import DOMAINS, FAMILY_FIELDS

# Bad values per domain: each is outside the domain, so each must be refused.
BAD: dict[str, list[Any]] = {
    "count": [0, -2, 64.5, "64", True, [4], {"n": 4}, 2**40],
    "count0": [-1, 1.5, "0", True, [0], 2**40],
    "flag": ["yes", 0.5, [True]],
    "object": [5, "x", [1]],
    "objects": [5, "x", [1], [[{}]]],
    "names": ["full_attention", [1], 5],
    "text": [5, ["jamba"]],
    "bits": [[2], "0101", [0.5], [True], 5],
    "counts0": ["4,128", [-1], [1.5], ["4"], 5, {"0": 4}],
    "layer_numbers": [[0], [-1], "1,2", [1.5], 5],
    "window_pattern": [0, -1, 1.5, "", "LLX", ["L"]],
    "nemotron_pattern": ["", "MXM", 5, ["M"]],
    "torch_dtype": ["bfloat17", 5, ["bfloat16"]],
    "state_dtype": ["float8_e4m3fn", "int8", "bfloat17", 5],
}


def test_every_domain_has_bad_values() -> None:
    assert set(BAD) == set(DOMAINS)
    for domain, values in BAD.items():
        test, _ = DOMAINS[domain]
        assert not any(test(v) for v in values), domain


def test_every_family_has_a_row_and_a_config() -> None:
    families = {family_of(FAMILY_CONFIGS[f]())[0] for f in FAMILY_CONFIGS}
    assert families == set(FAMILY_FIELDS) == set(FAMILY_CONFIGS)
    assert set(BY_MODEL_TYPE) <= set(FAMILY_FIELDS)


class Recording(Mapping[str, Any]):
    """A config that notes each field read from it (nested objects as dotted paths)."""

    def __init__(self, data: Mapping[str, Any], seen: set[str], prefix: str = "") -> None:
        self.data, self.seen, self.prefix = data, seen, prefix

    def __getitem__(self, key: str) -> Any:
        self.seen.add(self.prefix + key)
        value = self.data[key]
        return Recording(value, self.seen, f"{self.prefix}{key}.") if isinstance(value, Mapping) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_the_table_lists_every_field_the_rule_reads(family: str) -> None:
    config = with_defaults(FAMILY_CONFIGS[family]())
    name, rule = family_of(config)
    seen: set[str] = set()
    rule(Recording(config, seen), Context(kv_dtype="bf16", tp_size=1, max_seq_len=None))
    assert seen, family
    missing = sorted(seen - set(FAMILY_FIELDS[name]))
    assert not missing, f"{family} reads fields the table does not check: {missing}"


def set_path(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `config` with dotted `path` set to `value` (objects made on the way)."""
    out = copy.deepcopy(config)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value
    return out


def cases() -> list[tuple[str, str, Any]]:
    return [
        (family, path, value)
        for family, fields in sorted(FAMILY_FIELDS.items())
        for path, domain in fields.items()
        for value in BAD[domain]
    ]


CASES = cases()


def test_the_generated_suite_covers_every_field_of_every_family() -> None:
    assert len(CASES) > 1000
    assert {(f, p) for f, p, _ in CASES} == {(f, p) for f, fields in FAMILY_FIELDS.items() for p in fields}


@pytest.mark.parametrize(("family", "path", "value"), CASES, ids=[f"{f}-{p}={v!r:.20}" for f, p, v in CASES])
def test_a_bad_family_field_is_refused_by_name(family: str, path: str, value: Any) -> None:
    config = set_path(FAMILY_CONFIGS[family](), path, value)
    with pytest.raises(SpecError) as e:
        load_model_spec(config)
    named = path.split(".")[-1] if path.startswith("linear_attention.") else path
    assert named in str(e.value), f"{path} not named: {e.value}"


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_the_cli_refuses_each_familys_bad_fields_in_one_line(cli: Any, tmp_path: Path, family: str) -> None:
    """The first bad value of each field of the family, as a file `kvpool inspect` reads."""
    path = tmp_path / "config.json"
    for field, domain in FAMILY_FIELDS[family].items():
        path.write_text(json.dumps(set_path(FAMILY_CONFIGS[family](), field, BAD[domain][0])))
        code, out, err = cli("inspect", str(path))
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (field, err)
        assert field.split(".")[-1] in err and str(path) in err and out == "", (field, err)


@pytest.mark.parametrize(
    ("family", "fields", "words"),
    [
        ("jamba", {"attn_layer_offset": 8}, ["attn_layer_offset", "attn_layer_period"]),  # no attention layer left
        ("jamba", {"attn_layer_offset": 12}, ["attn_layer_offset"]),
        ("nemotron_h", {"hybrid_override_pattern": "M-M*-M*M"}, ["hybrid_override_pattern", "7 layers"]),
        ("nemotron_h", {"hybrid_override_pattern": "M-M*-"}, ["hybrid_override_pattern"]),
        ("deepseek_v4", {"compress_ratios": [4, 128]}, ["compress_ratios"]),
        ("deepseek_v4", {"compress_ratios": "4"}, ["compress_ratios"]),
        ("kimi_linear", {"linear_attn_config": {"num_heads": 8, "head_dim": 64, "short_conv_kernel_size": 0}}, ["short_conv_kernel_size"]),
        ("qwen3_next", {"linear_attention": {"num_key_heads": -16}}, ["num_key_heads"]),
        ("mimo_v2_flash", {"swa_num_key_value_heads": 0}, ["swa_num_key_value_heads"]),
        ("nemotron_h", {"mamba_ssm_cache_dtype": "float8"}, ["mamba_ssm_cache_dtype"]),
    ],
)  # fmt: skip
def test_the_issues_cases_are_refused_by_name(family: str, fields: dict[str, Any], words: list[str]) -> None:
    base = FAMILY_CONFIGS[family]()
    if family == "nemotron_h":
        base = FAMILY_CONFIGS[family]() | {"num_hidden_layers": 7, "hybrid_override_pattern": "M-M*-M*"}
        load_model_spec(base)  # the pattern alone is what is wrong below
    with pytest.raises(SpecError) as e:
        load_model_spec(base | fields)
    for word in words:
        assert word in str(e.value), e.value
