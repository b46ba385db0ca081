"""Lower-precision copies of the converted model for vLLM's CPU backend (issue 9).

What vLLM 0.32's CPU backend can run for a dense Llama model (read from
``vllm/model_executor/kernels/linear/``): compressed-tensors checkpoints with

- ``w8a8``: int8 weights (per output channel, symmetric) and int8 activations quantised per
  token at run time (``CPUInt8ScaledMMLinearKernel``: oneDNN, or SGL kernels on AMX CPUs);
- ``w4a16``: 4-bit weights in groups of 32 along the input (asymmetric, zero points;
  ``CPUWNA16LinearKernel``, ``cpu_gemm_wna16``), bf16 activations. Only on AVX-512 CPUs: the
  wheel's AVX2 library (``vllm/_C_AVX2.abi3.so``, the one loaded on this AMD EPYC without
  AVX-512) has no ``cpu_gemm_wna16``; loading fails with ``AttributeError: '_OpNamespace' '_C'
  object has no attribute 'cpu_gemm_wna16'`` (checked here). :func:`cpu_supports` says so first.

Weight-only int8 (W8A16) has no CPU kernel in this vLLM (``CPUWNA16`` takes 4-bit types only),
nor does online int8 for dense layers (``int8_per_channel_weight_only`` covers MoE experts).

The copy is made at preparation time (``make model CHAT_ENGINE_QUANTIZATION=w4a16``, or
``python -m inference.quantize --variant w4a16``) from the bf16 folder ``inference.convert``
writes, by round-to-nearest min/max quantisation of every linear layer of the decoder (the
embedding and the tied ``lm_head`` stay bf16), into ``<model folder>-<variant>`` beside it. A
marker records the source folder's marker, so a second run is a no-op.

:func:`quality_report` compares a variant with bf16 through vLLM itself: greedy-token agreement
over the first 64 tokens on a fixed prompt set and perplexity on a fixed text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

MARKER = ".quantized-from.json"
VARIANTS = ("w8a8", "w4a16")
W4_GROUP_SIZE = 32
LINEAR_SUFFIXES = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)  # fmt: skip

# Quality check inputs (fixed: the numbers in docs/engine-tuning.md come from exactly these).
QUALITY_PROMPTS = [
    "Write three sentences about the ocean.",
    "Explain what a hash table is.",
    "Give me a short recipe for pancakes.",
    "What are the main causes of climate change?",
    "Describe the water cycle in simple terms.",
    "List five tips for writing clean code.",
    "Why is the sky blue?",
    "How does a bicycle stay upright?",
    "Explain recursion to a ten year old.",
    "What should I pack for a weekend hiking trip?",
    "How do vaccines work?",
    "What is photosynthesis?",
]
PERPLEXITY_TEXT = (
    "The water cycle describes how water moves between the land, the oceans and the air. "
    "Energy from the sun warms the surface of lakes, rivers and seas, and some of the water "
    "evaporates into water vapour. Plants release water vapour through their leaves as well, "
    "a process called transpiration. As the warm, moist air rises it cools, and the vapour "
    "condenses into tiny droplets that form clouds. When the droplets join together and grow "
    "heavy enough, they fall back to the ground as rain, snow, sleet or hail. Some of this "
    "precipitation soaks into the soil and becomes groundwater, which can feed springs and "
    "wells for many years. The rest runs off over the surface into streams and rivers, which "
    "carry it back to the sea, where the cycle begins again. People depend on every stage of "
    "the cycle: farmers need rain for their crops, cities store river water in reservoirs, "
    "and many villages draw their drinking water from deep wells. Because the cycle links the "
    "weather, the climate and the supply of fresh water, scientists study it closely to "
    "understand droughts and floods and to plan how water is shared in the future.\n\n"
    "A hash table is a data structure that stores pairs of keys and values. To find where a "
    "key belongs, the table runs the key through a hash function, which turns it into a "
    "number, and uses that number to pick one of many buckets. Looking up a value then takes "
    "about the same time however many items the table holds, as long as the hash function "
    "spreads the keys evenly. When two keys land in the same bucket, the table must resolve "
    "the collision, either by keeping a short list in each bucket or by probing for the next "
    "free slot. Most programming languages ship a hash table in their standard library, under "
    "names such as dictionary, map or associative array."
)


class QuantizeError(RuntimeError):
    """The source folder is missing or incomplete, or the variant is unknown."""


def quantized_path(model_path: str | os.PathLike, variant: str) -> Path:
    """The folder a ``variant`` of ``model_path`` lives in: ``<model_path>-<variant>``."""
    if variant not in VARIANTS:
        raise QuantizeError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    source = Path(model_path)
    return source.with_name(f"{source.name}-{variant}")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (``/proc/cpuinfo``'s first ``flags`` line,
    e.g. ``{"avx2", "avx512_vnni", "amx_int8", ...}``); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def auto_variant(flags: set[str] | None = None) -> str:
    """The weights ``CHAT_ENGINE_QUANTIZATION=auto`` serves on this CPU: ``"w8a8"`` where int8
    matrix products have hardware support (AMX-INT8 or AVX-512 VNNI, ``flags`` as
    :func:`cpu_flags` gives them), else ``""`` (the unquantised weights).

    Measured (docs/engine-tuning.md): on an Intel Xeon with AMX, w8a8 took single-stream TPOT
    from 57.0 to 48.6 ms (25.8-37.3 ms with 2 threads and n-gram speculation) at perplexity
    1.015x of bf16; on an AMD EPYC with AVX2 only (no VNNI) oneDNN's s8s8 GEMM is ~7x slower
    than float32 at batch 1 and decode went to ~190 ms/token."""
    flags = cpu_flags() if flags is None else flags
    return "w8a8" if flags & {"amx_int8", "avx512_vnni"} else ""


def cpu_supports(variant: str) -> tuple[bool, str]:
    """Whether this machine's vLLM kernels can run ``variant`` -> (ok, why not)."""
    import torch  # noqa: PLC0415

    if variant == "w4a16" and not torch.cpu._is_avx512_supported():
        return False, (
            "4-bit weights need vLLM's AVX-512 kernels (cpu_gemm_wna16); this CPU has AVX2 "
            "only. Use w8a8, or no quantisation."
        )
    return True, ""


def _scheme(variant: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: PLC0415

    if variant == "w8a8":
        return "int-quantized", QuantizationScheme(
            targets=["Linear"],
            weights=QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel"),
            input_activations=QuantizationArgs(
                num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True
            ),
        )
    return "pack-quantized", QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=False, strategy="group", group_size=W4_GROUP_SIZE
        ),
    )


def _qparams(weight, args):
    """Round-to-nearest min/max scale and zero point of a [out, in] weight for ``args``."""
    import torch  # noqa: PLC0415
    from compressed_tensors.quantization.utils import calculate_qparams  # noqa: PLC0415

    w = weight.float()
    if args.strategy == "group":
        out, inp = w.shape
        grouped = w.reshape(out, inp // args.group_size, args.group_size)
        lo, hi = grouped.amin(dim=-1), grouped.amax(dim=-1)
    else:  # per output channel
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    scale, zero_point = calculate_qparams(lo, hi, args)
    # Per-channel int8 scales stay float32: rounded to bf16 (8 mantissa bits) each channel's
    # scale would be off by up to 0.4%, as much as the int8 rounding itself. The 4-bit kernel
    # takes its group scales in the activations' dtype.
    return scale.to(torch.float32 if args.num_bits == 8 else torch.bfloat16), zero_point


def quantize_state_dict(state: dict, variant: str) -> tuple[dict, dict]:
    """Quantise the decoder's linear layers of a Llama state dict.

    ``state``: name -> tensor (bf16) as ``inference.convert`` saves it. Returns (the new state
    dict, the ``quantization_config`` for config.json). Layers whose input size is not a
    multiple of the group size stay bf16 (listed in the config's ``ignore``).
    """
    from compressed_tensors.compressors.base import BaseCompressor  # noqa: PLC0415
    from compressed_tensors.quantization import QuantizationConfig  # noqa: PLC0415

    fmt, scheme = _scheme(variant)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    out: dict = {}
    ignore = ["lm_head"]
    for name, tensor in state.items():
        module, _, leaf = name.rpartition(".")
        if leaf != "weight" or not module.endswith(LINEAR_SUFFIXES):
            out[name] = tensor
            continue
        if scheme.weights.group_size and tensor.shape[1] % scheme.weights.group_size:
            out[name] = tensor
            ignore.append(module)
            continue
        scale, zero_point = _qparams(tensor, scheme.weights)
        module_state = {"weight": tensor.float(), "weight_scale": scale}
        if not scheme.weights.symmetric:
            module_state["weight_zero_point"] = zero_point
        for key, value in compressor.compress(module_state, scheme).items():
            out[f"{module}.{key}"] = value.contiguous()
    config = QuantizationConfig(
        config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
        ignore=ignore,
    ).model_dump(exclude_none=True)  # fmt: skip
    config["quant_method"] = "compressed-tensors"
    return out, config


def _source_marker(source: Path) -> dict:
    marker = source / ".converted-from.json"
    recorded = json.loads(marker.read_text()) if marker.is_file() else {}
    weights = source / "model.safetensors"
    return {"source": str(source.resolve()), "converted": recorded,
            "weights_mtime_ns": weights.stat().st_mtime_ns}  # fmt: skip


def is_quantized(source: Path, variant: str) -> bool:
    """True if the variant's folder holds a complete quantisation of this ``source``."""
    dest = quantized_path(source, variant)
    marker = dest / MARKER
    if not (marker.is_file() and (dest / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(marker.read_text()) == {**_source_marker(source), "variant": variant}
    except (OSError, ValueError):
        return False


def quantize(source: Path, variant: str) -> Path:
    """Write ``<source>-<variant>`` (weights, config with its quantization_config, tokenizer)
    and return it; a no-op when it is already there. Built in a temporary sibling and renamed
    into place. Raises QuantizeError when ``source`` is not a converted model folder."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    if not (source / "config.json").is_file() or not (source / "model.safetensors").is_file():
        raise QuantizeError(f"{source} is not a converted model folder; run `make model` first")
    dest = quantized_path(source, variant)
    if is_quantized(source, variant):
        return dest
    work = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        state, qconfig = quantize_state_dict(load_file(str(source / "model.safetensors")), variant)
        save_file(state, str(work / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((source / "config.json").read_text())
        config["quantization_config"] = qconfig
        (work / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        for item in source.iterdir():
            if item.name not in ("config.json", "model.safetensors") and item.is_file() \
                    and not item.name.startswith("."):
                shutil.copy2(item, work / item.name)
        (work / MARKER).write_text(json.dumps({**_source_marker(source), "variant": variant}))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return dest


# --------------------------------------------------------------------------------------------
# Quality: the variant vs bf16, both through vLLM


async def _engine_outputs(model: str, tokenizer: str, greedy_tokens: int, dtype: str) -> dict:
    """Greedy token ids for QUALITY_PROMPTS and the perplexity of PERPLEXITY_TEXT."""
    import math  # noqa: PLC0415

    from vllm import AsyncEngineArgs, SamplingParams  # noqa: PLC0415
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

    args = AsyncEngineArgs(
        model=model, tokenizer=tokenizer, dtype=dtype, enforce_eager=True,
        max_model_len=2048, max_num_seqs=16, kv_cache_memory_bytes=256 << 20,
        disable_log_stats=True, enable_prefix_caching=False,
    )  # fmt: skip
    llm = AsyncLLM.from_engine_args(args)
    try:
        tok = llm.get_tokenizer()

        async def run(request_id, prompt_ids, params):
            final = None
            async for output in llm.generate({"prompt_token_ids": prompt_ids}, params, request_id):
                final = output
            return final

        import asyncio  # noqa: PLC0415

        greedy = SamplingParams(max_tokens=greedy_tokens, temperature=0.0, ignore_eos=True)
        prompts = []
        for text in QUALITY_PROMPTS:
            ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                          add_generation_prompt=True)  # fmt: skip
            prompts.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
        outs = await asyncio.gather(*(
            run(f"q{i}", ids, greedy) for i, ids in enumerate(prompts)
        ))  # fmt: skip
        text_ids = [tok.bos_token_id] if tok.bos_token_id is not None else []
        text_ids += tok.encode(PERPLEXITY_TEXT, add_special_tokens=False)
        scored = await run("ppl", text_ids, SamplingParams(max_tokens=1, prompt_logprobs=0))
        nll = []
        for position, entry in enumerate(scored.prompt_logprobs or []):
            if entry is None:
                continue  # the first token has no prediction
            nll.append(-entry[text_ids[position]].logprob)
        return {
            "greedy": [list(o.outputs[0].token_ids) for o in outs],
            "ppl": math.exp(sum(nll) / len(nll)),
            "ppl_tokens": len(nll),
        }
    finally:
        llm.shutdown()


def compare(base: dict, other: dict, n: int) -> dict:
    """Agreement of two runs' greedy tokens: positional agreement over the first ``n`` tokens
    (mean over prompts) and the mean matching prefix (as a fraction of ``n``)."""
    positional, prefix = [], []
    for a, b in zip(base["greedy"], other["greedy"], strict=True):
        a, b = a[:n], b[:n]
        positional.append(sum(x == y for x, y in zip(a, b)) / n)
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefix.append(k / n)
    return {
        "agreement": sum(positional) / len(positional),
        "prefix_match": sum(prefix) / len(prefix),
        "ppl_reference": base["ppl"],
        "ppl_quantized": other["ppl"],
        "ppl_ratio": other["ppl"] / base["ppl"],
        "ppl_tokens": base["ppl_tokens"],
        "prompts": len(positional),
    }


def quality_report(model_path: str, variant: str, n: int = 64, dtype: str = "bfloat16") -> dict:
    """Greedy agreement (first ``n`` tokens, QUALITY_PROMPTS) and perplexity (PERPLEXITY_TEXT)
    of ``variant`` vs the unquantised model, both run in ``dtype`` (activations; the reference's
    weights too) through a fresh vLLM engine each (two starts, ~1 min each here).
    Raises QuantizeError if the variant's folder is missing."""
    import asyncio  # noqa: PLC0415

    dest = quantized_path(model_path, variant)
    if not (dest / "config.json").is_file():
        raise QuantizeError(f"{dest} is missing; run python -m inference.quantize --variant "
                            f"{variant}")  # fmt: skip
    base = asyncio.run(_engine_outputs(model_path, model_path, n, dtype))
    other = asyncio.run(_engine_outputs(str(dest), model_path, n, dtype))
    return {"variant": variant, "dtype": dtype, **compare(base, other, n)}


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m inference.quantize [--variant w4a16] [--quality] [SOURCE]``."""
    from inference.convert import DEFAULT_DEST  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_DEST)
    parser.add_argument("--variant", choices=(*VARIANTS, "auto", "none", ""), required=True,
                        help="auto: the variant this CPU serves fastest (auto_variant); "
                        "none or empty: nothing to make")
    parser.add_argument("--quality", action="store_true",
                        help="also compare with the unquantised model")
    parser.add_argument("--dtype", default="bfloat16", help="activations' dtype for --quality")
    args = parser.parse_args(argv)
    if args.variant == "auto":
        args.variant = auto_variant()
        if not args.variant:
            print("CHAT_ENGINE_QUANTIZATION=auto: this CPU has no int8 matrix units (AMX-INT8 or "
                  "AVX-512 VNNI); the unquantised weights are served, nothing to make")
            return 0
    if args.variant in ("none", ""):
        return 0
    if is_quantized(args.source, args.variant):
        print(f"quantised model ready: {quantized_path(args.source, args.variant)}")
    else:
        print(f"quantising {args.source.name} -> {args.variant} (once)")
        print(f"quantised model ready: {quantize(args.source, args.variant)}")
    if args.quality:
        print(json.dumps(quality_report(str(args.source), args.variant, dtype=args.dtype),
                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
