"""KV dtype `auto` is what engines serve: the checkpoint's dtype, bf16 for a
float32 checkpoint (said in the output), and the KV scheme a quantization_config
declares (compressed-tensors / ModelOpt `kv_cache_scheme`, ModelOpt
`kv_cache_quant_algo`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpool.errors import SpecError
from kvpool.spec import load_model_spec
from kvpool.spec.dtypes import auto_kv_dtype, engine_auto_dtype

CONFIGS = Path(__file__).parent / "data" / "configs"


def tiny(**extra: Any) -> dict[str, Any]:
    """2 layers, 2 KV heads of 64 values: one layer's K+V row is 2 x 2 x 64 = 256 values."""
    return {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        **extra,
    }


def row_bytes_per_layer(config: dict[str, Any], kv_dtype: str = "auto") -> int:
    spec = load_model_spec(config, kv_dtype=kv_dtype)
    (group,) = spec.groups
    return group.row_bytes // len(group.layers)


@pytest.mark.parametrize(
    ("fields", "dtype", "row"),
    [
        ({"torch_dtype": "bfloat16"}, "bf16", 512),
        ({"torch_dtype": "float16"}, "fp16", 512),
        ({"dtype": "float16"}, "fp16", 512),  # transformers 5 writes `dtype`
        ({}, "bf16", 512),
    ],
)
def test_auto_is_the_checkpoint_dtype(fields: dict[str, Any], dtype: str, row: int) -> None:
    spec = load_model_spec(tiny(**fields))
    assert (spec.kv_dtype, spec.kv_dtype_note) == (dtype, None)
    assert row_bytes_per_layer(tiny(**fields)) == row


def test_a_float32_checkpoint_is_served_in_bf16_and_says_so() -> None:
    spec = load_model_spec(tiny(torch_dtype="float32"))
    assert spec.kv_dtype == "bf16"
    assert spec.kv_dtype_note is not None and "float32" in spec.kv_dtype_note and "bf16" in spec.kv_dtype_note
    assert row_bytes_per_layer(tiny(torch_dtype="float32")) == 256 * 2
    # asking for fp32 explicitly still gets fp32, without a note
    explicit = load_model_spec(tiny(torch_dtype="float32"), kv_dtype="fp32")
    assert (explicit.kv_dtype, explicit.kv_dtype_note) == ("fp32", None)
    assert row_bytes_per_layer(tiny(torch_dtype="float32"), "fp32") == 256 * 4


FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


@pytest.mark.parametrize(
    ("quant", "dtype", "field"),
    [
        # compressed-tensors (llm-compressor) FP8 KV
        ({"quant_method": "compressed-tensors", "kv_cache_scheme": FP8}, "fp8", "kv_cache_scheme"),
        # ModelOpt in config.json, the older and the newer spelling
        ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, "fp8", "kv_cache_quant_algo"),
        ({"quant_method": "modelopt", "kv_cache_scheme": "FP8"}, "fp8", "kv_cache_scheme"),
        ({"quant_method": "modelopt", "kv_cache_quant_algo": "NVFP4"}, "nvfp4", "kv_cache_quant_algo"),
        # ModelOpt's hf_quant_config.json layout
        (
            {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
            "fp8",
            "quantization.kv_cache_quant_algo",
        ),
    ],
)
def test_a_declared_kv_scheme_sets_auto(quant: dict[str, Any], dtype: str, field: str) -> None:
    config = tiny(torch_dtype="bfloat16", quantization_config=quant)
    spec = load_model_spec(config)
    assert spec.kv_dtype == dtype
    assert spec.kv_dtype_note is not None and f"quantization_config.{field}" in spec.kv_dtype_note
    # 256 values: 1 byte each in FP8; NVFP4 packs 2 per byte plus one FP8 scale per 16
    assert row_bytes_per_layer(config) == {"fp8": 2 * 128, "nvfp4": 2 * (64 + 8)}[dtype]
    # an explicit dtype wins over the declared scheme
    assert load_model_spec(config, kv_dtype="bf16").kv_dtype == "bf16"


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "awq", "bits": 4},  # weights only
        {"quant_method": "compressed-tensors", "kv_cache_scheme": None},
        {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},  # DeepSeek-V3's FP8 weights
    ],
)
def test_weight_only_quantization_leaves_auto_at_the_model_dtype(quant: dict[str, Any]) -> None:
    spec = load_model_spec(tiny(torch_dtype="bfloat16", quantization_config=quant))
    assert (spec.kv_dtype, spec.kv_dtype_note) == ("bf16", None)


@pytest.mark.parametrize(
    ("quant", "named"),
    [
        ({"kv_cache_scheme": {"num_bits": 8, "type": "int"}}, "quantization_config.kv_cache_scheme"),
        ({"quant_method": "modelopt", "kv_cache_quant_algo": "INT8"}, "'INT8'"),
        ({"kv_cache_scheme": 8}, "quantization_config.kv_cache_scheme"),
    ],
)
def test_a_kv_scheme_kvpool_cannot_store_is_refused_by_name(quant: dict[str, Any], named: str) -> None:
    config = tiny(quantization_config=quant)
    with pytest.raises(SpecError, match="kv_cache") as err:
        load_model_spec(config)
    assert named in str(err.value)
    # vLLM resolves auto from ModelOpt schemes only; elsewhere its auto is the served dtype
    assert engine_auto_dtype(config) == (None if quant.get("quant_method") == "modelopt" else "bf16")
    assert load_model_spec(config, kv_dtype="fp8").kv_dtype == "fp8"  # the way out the message names


def test_real_modelopt_checkpoint_with_fp8_kv() -> None:
    """nvidia/Gemma-4-31B-IT-NVFP4: `quant_method: modelopt`, NVFP4 weights and
    `kv_cache_scheme {"num_bits": 8, "type": "float"}`, which vLLM serves with an FP8 KV cache."""
    config = json.loads((CONFIGS / "Gemma-4-31B-IT-NVFP4.json").read_text())
    assert auto_kv_dtype(config)[0] == "fp8"
    spec = load_model_spec(CONFIGS / "Gemma-4-31B-IT-NVFP4.json")
    assert spec.kv_dtype == "fp8"
    full = spec.group("full")  # 10 global layers of 4 KV heads x 512, K and V, 1 byte each
    assert full.row_bytes == 10 * 2 * 4 * 512
    # the bf16 checkpoint of the same family has no scheme: auto stays bf16
    assert load_model_spec(CONFIGS / "gemma-4-26B-A4B.json").kv_dtype == "bf16"
    # nvidia/Kimi-K2.5-NVFP4 (DeepSeek-V3 MLA inside a kimi_k25 wrapper): FP8 latent rows, 512 + 64 bytes
    kimi = load_model_spec(CONFIGS / "Kimi-K2.5-NVFP4.json")
    assert kimi.kv_dtype == "fp8" and kimi.group("mla").row_bytes == 61 * 576


def test_real_modelopt_string_scheme() -> None:
    spec = load_model_spec(CONFIGS / "Qwen3-32B-FP8-Static-PerTensor.json")
    assert spec.kv_dtype == "fp8"
    assert load_model_spec(CONFIGS / "Qwen3-32B.json").kv_dtype == "bf16"


def write(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_plan_and_inspect_say_why_auto_is_bf16(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, tiny(torch_dtype="float32"))
    code, out, err = cli("plan", path, "--kv-memory", "1GiB", "--max-seq-len", "4096")
    assert code == 0, err
    assert "note: kv dtype auto = bf16: the checkpoint is float32" in out
    code, out, err = cli("plan", path, "--kv-memory", "1GiB", "--max-seq-len", "4096", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["kv_dtype"] == "bf16" and "float32" in data["kv_dtype_note"]
    code, out, err = cli("inspect", path)
    assert code == 0, err
    assert "kv bf16" in out and "note: kv dtype auto = bf16" in out
    code, out, err = cli("inspect", path, "--json")
    assert code == 0 and "float32" in json.loads(out)["kv_dtype_note"]


def test_plan_json_note_is_null_for_a_plain_checkpoint(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("plan", write(tmp_path, tiny(torch_dtype="bfloat16")), "--kv-memory", "1GiB", "--json")
    assert code == 0, err
    assert (json.loads(out)["kv_dtype"], json.loads(out)["kv_dtype_note"]) == ("bf16", None)


def test_a_bad_kv_scheme_is_exit_2_in_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, tiny(quantization_config={"kv_cache_scheme": {"num_bits": 8, "type": "int"}}))
    code, out, err = cli("inspect", path)
    assert code == 2 and err.count("\n") == 1 and "kv_cache_scheme" in err, err


MODELOPT = Path(__file__).parent / "data" / "modelopt" / "Llama-3.1-70B-Instruct-FP8"


def test_modelopt_hf_quant_config_beside_config_json_sets_fp8() -> None:
    """nvidia/Llama-3.1-70B-Instruct-FP8: config.json has no quantization_config, the
    hf_quant_config.json beside it says kv_cache_quant_algo FP8 (vLLM reads it there)."""
    assert "quantization_config" not in json.loads((MODELOPT / "config.json").read_text())
    for source in (MODELOPT, MODELOPT / "config.json"):
        spec = load_model_spec(source)
        assert spec.kv_dtype == "fp8"
        assert spec.group("full").row_bytes == 80 * 2 * 8 * 128  # 80 layers, K+V, 8 heads of 128, 1 byte


def test_the_sidecar_is_ignored_when_config_json_has_its_own(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny(quantization_config={"quant_method": "awq"})))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"kv_cache_quant_algo": "FP8"}}))
    assert load_model_spec(tmp_path).kv_dtype == "bf16"


def test_a_broken_sidecar_is_exit_2_naming_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps(tiny()))
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    code, out, err = cli("inspect", str(tmp_path))
    assert code == 2 and "hf_quant_config.json" in err and err.count("\n") == 1, err


def vllm_kv_flag(cli, path: str, *extra: str) -> str:  # type: ignore[no-untyped-def]
    code, out, err = cli(
        "plan", path, "--kv-memory", "1GiB", "--max-seq-len", "4096", "--emit", "vllm", "--json", *extra
    )
    assert code == 0, err
    argv = json.loads(out)["argv"]
    return str(argv[argv.index("--kv-cache-dtype") + 1])


@pytest.mark.parametrize(
    ("fields", "extra", "flag"),
    [
        # float32 checkpoint: vLLM's own auto is bf16 too
        ({"torch_dtype": "float32"}, (), "auto"),
        # ModelOpt: vLLM's auto reads the scheme, so fp8 is its auto...
        ({"quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}, (), "auto"),
        # ...and a bf16 plan of that checkpoint must say bfloat16
        (
            {"quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}},
            ("--kv-dtype", "bf16"),
            "bfloat16",
        ),
        # compressed-tensors: vLLM uses the scheme's scales when fp8 is asked for
        ({"quantization_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": FP8}}, (), "fp8"),
    ],
)
def test_vllm_launch_line_names_the_dtype_unless_vllm_auto_gives_it(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, fields: dict[str, Any], extra: tuple[str, ...], flag: str
) -> None:
    assert vllm_kv_flag(cli, write(tmp_path, tiny(**{"torch_dtype": "bfloat16", **fields})), *extra) == flag
