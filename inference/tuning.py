"""The engine's speed levers (issue 9): the ``CHAT_ENGINE_*`` settings read, validated and
resolved against the detected CPU (:class:`EngineTuning`); inference/engine.py starts vLLM with
them, inference/checks.py refuses invalid ones at start (chat.E003)."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

from django.conf import settings

from inference.errors import EngineUnavailable

logger = logging.getLogger(__name__)

QUANTIZED_VARIANTS = ("w8a8", "w4a16")
_SPECULATIVE_SHORTHANDS = {
    # Prompt lookup: propose the tokens that followed the last 2-4 tokens' earlier occurrence
    # in the prompt or the answer so far; no draft model.
    "ngram": {"method": "ngram", "num_speculative_tokens": 4,
              "prompt_lookup_min": 2, "prompt_lookup_max": 4},
}  # fmt: skip


@dataclass(frozen=True)
class EngineTuning:
    """The engine's speed levers (issue 9), from the ``CHAT_ENGINE_*`` settings.

    - ``eager``: True skips torch.compile (start ~30 s); False compiles (faster decode, slower
      first start). ``compile_sizes``: batch sizes inductor specialises for (compile mode).
    - ``dtype``: weights/activations dtype. ``auto``: bfloat16 where the CPU computes in it
      (AVX-512 BF16 / AMX), else float32: on AVX2 (this machine) oneDNN has no bf16 matmul and
      vLLM falls back to PyTorch's bf16 linear, ~9x slower for a 200-token prefill.
    - ``block_size``: KV cache block, tokens (0: vLLM's CPU default, 128; multiples of 32).
    - ``threads_bind`` / ``reserved_cpus``: vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` (``auto``,
      ``nobind`` or CPU ids like ``0-1``) and ``VLLM_CPU_NUM_OF_RESERVED_CPU`` ("" / None:
      vLLM's own choice); set in this process's environment before the engine starts, which
      its spawned processes inherit.
    - ``max_batched_tokens``: chunked-prefill budget per step (0: vLLM's default).
    - ``speculative``: a vLLM ``speculative_config`` dict (n-gram prompt lookup) or None.
    - ``quantization``: "" (unquantised weights), ``auto`` (w8a8 on CPUs with int8 matrix
      units, else unquantised: :meth:`resolved_quantization`) or a variant in
      :data:`QUANTIZED_VARIANTS`, served from the folder ``inference/quantize.py`` writes beside
      the model.
    - ``prefix_caching``: vLLM's automatic prefix caching.
    - ``cpu_kernels``: vLLM's C kernels for RMSNorm on the CPU instead of the PyTorch-native
      composition (inference/vllm_plugin.py; :meth:`ir_op_priority`).
    """

    eager: bool = True
    dtype: str = "auto"
    block_size: int = 0
    threads_bind: str = ""
    reserved_cpus: int | None = None
    max_batched_tokens: int = 0
    speculative: dict | None = None
    quantization: str = ""
    prefix_caching: bool = True
    compile_sizes: tuple[int, ...] = ()
    cpu_kernels: bool = True

    @classmethod
    def from_settings(cls) -> EngineTuning:
        """Validate the ``CHAT_ENGINE_*`` settings; raise ImproperlyConfigured naming the
        variable and the accepted values for a bad one."""
        from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

        def bad(name: str, value, expected: str) -> ImproperlyConfigured:
            return ImproperlyConfigured(f"{name}={value!r} is not valid: expected {expected}.")

        dtype = str(getattr(settings, "CHAT_ENGINE_DTYPE", "auto")).strip().lower()
        if dtype not in ("auto", "bfloat16", "float32", "float16"):
            raise bad("CHAT_ENGINE_DTYPE", dtype, "auto, bfloat16, float16 or float32")
        block_size = getattr(settings, "CHAT_ENGINE_BLOCK_SIZE", 0)
        if not isinstance(block_size, int) or block_size < 0 or block_size % 32:
            raise bad("CHAT_ENGINE_BLOCK_SIZE", block_size,
                      "0 (vLLM's default, 128) or a positive multiple of 32 tokens")  # fmt: skip
        bind = str(getattr(settings, "CHAT_ENGINE_THREADS_BIND", "")).strip()
        if (
            bind
            and bind not in ("auto", "nobind")
            and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", bind)
        ):
            raise bad("CHAT_ENGINE_THREADS_BIND", bind,
                      "empty, auto, nobind or CPU ids such as 0-1 or 0,1")  # fmt: skip
        reserved = getattr(settings, "CHAT_ENGINE_RESERVED_CPUS", None)
        if reserved is not None and (not isinstance(reserved, int) or reserved < 0):
            raise bad("CHAT_ENGINE_RESERVED_CPUS", reserved, "empty or a whole number >= 0")
        batched = getattr(settings, "CHAT_ENGINE_MAX_BATCHED_TOKENS", 0)
        if not isinstance(batched, int) or batched < 0:
            raise bad("CHAT_ENGINE_MAX_BATCHED_TOKENS", batched,
                      "0 (vLLM's default) or a positive number of tokens")  # fmt: skip
        speculative = _parse_speculative(getattr(settings, "CHAT_ENGINE_SPECULATIVE", ""), bad)
        quantization = str(getattr(settings, "CHAT_ENGINE_QUANTIZATION", "")).strip().lower()
        quantization = "" if quantization == "none" else quantization
        if quantization and quantization not in (*QUANTIZED_VARIANTS, "auto"):
            raise bad("CHAT_ENGINE_QUANTIZATION", quantization,
                      "auto, none (unquantised weights) or one of "
                      + ", ".join(QUANTIZED_VARIANTS))  # fmt: skip
        sizes = getattr(settings, "CHAT_ENGINE_COMPILE_SIZES", ())
        if not all(isinstance(n, int) and n > 0 for n in sizes):
            raise bad("CHAT_ENGINE_COMPILE_SIZES", sizes, "batch sizes, e.g. 1,2,4,8,16")
        return cls(
            eager=bool(getattr(settings, "CHAT_ENGINE_EAGER", True)),
            dtype=dtype,
            block_size=block_size,
            threads_bind=bind,
            reserved_cpus=reserved,
            max_batched_tokens=batched,
            speculative=speculative,
            quantization=quantization,
            prefix_caching=bool(getattr(settings, "CHAT_ENGINE_PREFIX_CACHING", True)),
            compile_sizes=tuple(sizes),
            cpu_kernels=cpu_kernels_resolved(getattr(settings, "CHAT_ENGINE_CPU_KERNELS", "auto"), bad),
        )

    def resolved_dtype(self) -> str:
        """The dtype vLLM gets: ``dtype``, with ``auto`` resolved for this CPU."""
        if self.dtype != "auto":
            return self.dtype
        import torch  # noqa: PLC0415

        native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return "bfloat16" if native_bf16 else "float32"

    def resolved_quantization(self, model_path: str | None = None) -> str:
        """The weights variant served: ``quantization``, with ``auto`` resolved for this CPU
        (inference.quantize.auto_variant: w8a8 where the CPU has int8 matrix units, else none).
        With ``model_path``, an ``auto`` whose quantised sibling folder is missing (a model
        folder of the user's own, not made by ``make model``) resolves to "" (unquantised)."""
        if self.quantization != "auto":
            return self.quantization
        from inference.quantize import auto_variant, quantized_path  # noqa: PLC0415

        variant = auto_variant()
        if variant and model_path is not None:
            if not (quantized_path(model_path, variant) / "config.json").is_file():
                logger.warning(
                    "CHAT_ENGINE_QUANTIZATION=auto would serve %s on this CPU, but %s is "
                    "missing: serving the unquantised weights (make it with `make model`)",
                    variant, quantized_path(model_path, variant),
                )  # fmt: skip
                return ""
        return variant

    def weights_path(self, model_path: str) -> str:
        """The folder the weights load from: ``model_path`` itself, or its quantised sibling
        ``<model_path>-<variant>`` (:meth:`resolved_quantization`). Raises EngineUnavailable if
        an explicitly named variant's sibling is missing or this CPU cannot run it."""
        variant = self.resolved_quantization(model_path)
        if not variant:
            return model_path
        from inference.quantize import cpu_supports, quantized_path  # noqa: PLC0415

        supported, why = cpu_supports(variant)
        if not supported:
            raise EngineUnavailable(f"CHAT_ENGINE_QUANTIZATION={variant}: {why}")
        path = quantized_path(model_path, variant)
        if not (path / "config.json").is_file():
            raise EngineUnavailable(
                f"CHAT_ENGINE_QUANTIZATION={variant} needs the quantised model "
                f"{path}; make it with `make model CHAT_ENGINE_QUANTIZATION={variant}`"
                f" (python -m inference.quantize --variant {variant})."
            )
        return str(path)

    def ir_op_priority(self) -> dict[str, list[str]] | None:
        """vLLM's ``ir_op_priority`` engine argument: the plugin's CPU RMSNorm kernels first,
        vLLM's platform default (``native``) after them, or None (vLLM's defaults) when
        ``cpu_kernels`` is off or the plugin could not register them in this process (not a CPU
        platform, a vLLM without the kernels; naming an unregistered provider would fail the
        engine's start, vllm/ir/op.py ``_filter_priority_impls``)."""
        if not self.cpu_kernels:
            return None
        from inference import vllm_plugin  # noqa: PLC0415 - imports vLLM

        vllm_plugin.register()  # the entry point does it in vLLM's processes; here too, first
        if not vllm_plugin.registered():
            return None
        return {op: [vllm_plugin.PROVIDER] for op in vllm_plugin.OPS}

    def apply_process_env(self) -> None:
        """Set vLLM's CPU thread-binding variables in this process's environment (the engine's
        spawned processes inherit it); unset settings leave vLLM's defaults alone."""
        if self.threads_bind:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.threads_bind
        if self.reserved_cpus is not None:
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(self.reserved_cpus)

    def describe(self, model_path: str | None = None) -> str:
        """One line for the log: the levers that differ from vLLM's defaults (``model_path``:
        resolve ``auto`` quantisation as :meth:`weights_path` does for it)."""
        parts = ["eager" if self.eager else "compiled", self.resolved_dtype()]
        if self.quantization == "auto":
            parts.append(f"auto -> {self.resolved_quantization(model_path) or 'none'}")
        elif self.quantization:
            parts.append(self.quantization)
        if self.block_size:
            parts.append(f"block {self.block_size}")
        if self.threads_bind or self.reserved_cpus is not None:
            parts.append(f"bind {self.threads_bind or 'auto'}/{self.reserved_cpus}")
        if self.max_batched_tokens:
            parts.append(f"batched tokens {self.max_batched_tokens}")
        if self.speculative:
            parts.append(f"speculative {self.speculative.get('method')}")
        if not self.prefix_caching:
            parts.append("no prefix caching")
        if not self.cpu_kernels:
            parts.append("native norms")
        return ", ".join(parts)


def cpu_kernels_resolved(value, bad=None) -> bool:
    """``CHAT_ENGINE_CPU_KERNELS`` as a bool: ``auto`` -> whether the CPU converts to bf16 in
    hardware (``avx512_bf16`` in /proc/cpuinfo: vLLM's CPU kernels then round to nearest, as
    PyTorch does; without it - AVX2-only CPUs, and AVX-512 CPUs without BF16 such as the Intel
    Xeon (Ice Lake class) measured on 2026-12-07 - they truncate toward zero, so the native
    norms stay); a bool, or "1"/"0"/"true"/"false"/"on"/"off", as given. Raises ``bad(...)``'s
    error (ImproperlyConfigured) for anything else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == "auto":
        from inference.quantize import cpu_flags  # noqa: PLC0415 - reads /proc/cpuinfo

        return "avx512_bf16" in cpu_flags()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    if bad is None:
        raise ValueError(f"CHAT_ENGINE_CPU_KERNELS={value!r}: use auto, 1 or 0")
    raise bad("CHAT_ENGINE_CPU_KERNELS", value, "auto, 1 or 0")


def _parse_speculative(value, bad) -> dict | None:
    """CHAT_ENGINE_SPECULATIVE: "" / "off" (none), a shorthand ("ngram") or a JSON object
    (vLLM's speculative_config, e.g. {"method": "ngram", "num_speculative_tokens": 3})."""
    if isinstance(value, dict):
        config = dict(value)
    else:
        text = str(value or "").strip()
        if text.lower() in ("", "off", "none", "0"):
            return None
        if text in _SPECULATIVE_SHORTHANDS:
            return dict(_SPECULATIVE_SHORTHANDS[text])
        try:
            config = json.loads(text)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise bad("CHAT_ENGINE_SPECULATIVE", text,
                      'off, ngram, or a JSON object such as {"method": "ngram", '
                      '"num_speculative_tokens": 4, "prompt_lookup_max": 4}')  # fmt: skip
    if config.get("method") != "ngram":
        raise bad("CHAT_ENGINE_SPECULATIVE", value,
                  'method "ngram" (no draft model ships with this project)')  # fmt: skip
    tokens = config.get("num_speculative_tokens")
    if not isinstance(tokens, int) or tokens < 1:
        raise bad("CHAT_ENGINE_SPECULATIVE", value, "num_speculative_tokens >= 1")
    return config
