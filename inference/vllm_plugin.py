"""A vLLM general plugin: vLLM's own CPU kernels for the RMSNorm IR ops (issue 19 part 2).

vLLM 0.32 dispatches ``rms_norm`` and ``fused_add_rms_norm`` through its IR op registry
(``vllm/ir/ops/layernorm.py``). Its C implementations (``vllm/kernels/vllm_c.py``, provider
``vllm_c``) are registered as supported on GPU-like devices only, so on the CPU every norm runs
the PyTorch-native composition: 7-9 separate tensor ops, each a dispatch through Python and
ATen. The CPU build of ``vllm._C`` ships the same two kernels (``torch.ops._C.rms_norm`` /
``fused_add_rms_norm``, csrc/cpu/layernorm.cpp). A decode step of SmolLM2-135M calls them 61
times (two per decoder layer and the final norm); measured on one thread of a 2-core EPYC
(AVX-512 BF16), batch 1, bf16: 47 us native vs 7 us C per call, ~2.4 ms of a ~45 ms step.

:func:`register` adds those kernels as the IR provider :data:`PROVIDER` on the CPU platform. It
runs in every vLLM process (the ``vllm.general_plugins`` entry point in pyproject.toml: the
server's AsyncLLM, EngineCore and the CPU worker, which is where the forward pass runs;
vllm/plugins/__init__.py ``load_general_plugins``), and is idempotent, as vLLM asks of general
plugins. Registering changes nothing by itself: the engine asks for the provider through
``ir_op_priority`` (inference/engine.py, ``CHAT_ENGINE_CPU_KERNELS``), with ``native`` after it
as the fallback for arguments the kernel does not take (a variance size override, a weight of
another dtype).

``SiluAndMul`` is left native: vLLM's CPU path chooses it on purpose, and its C kernel measured
slower here at 16 and 200 tokens (101 vs 35 us, 3.4 vs 1.1 ms).

This module must not import Django: it is loaded inside vLLM's processes. The kernels carry
real annotations (no ``from __future__ import annotations``): vLLM wraps each implementation in a
torch custom op whose schema is inferred from them.
"""

import logging

PROVIDER = "chatsite_cpu"
OPS = ("rms_norm", "fused_add_rms_norm")


def _plain(x, weight, epsilon, variance_size=None) -> bool:
    # The C kernels normalise over the whole last dimension with a weight of x's dtype.
    return variance_size is None and weight is not None and weight.dtype == x.dtype


def _plain_add(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    # In place on both tensors (the C kernel writes through their data pointers).
    return (
        _plain(x, weight, epsilon, variance_size)
        and x_residual.dtype == x.dtype
        and x.is_contiguous()
        and x_residual.is_contiguous()
    )


def _kernels_loaded(torch) -> bool:
    try:
        torch.ops._C.rms_norm, torch.ops._C.fused_add_rms_norm  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def register() -> None:
    """Register :data:`PROVIDER` for :data:`OPS` on the CPU platform; a no-op elsewhere and on
    a second call. Never raises for a vLLM without these ops or kernels (the engine then keeps
    the native norms; ``registered()`` says which)."""
    try:
        import torch  # noqa: PLC0415
        from vllm import ir  # noqa: PLC0415
        from vllm.platforms import current_platform  # noqa: PLC0415

        if not current_platform.is_cpu():
            return
        import vllm.ir.ops  # noqa: F401, PLC0415 - registers the ops

        if PROVIDER in ir.ops.rms_norm.impls:
            return
        if not _kernels_loaded(torch):
            # Loads the vllm._C variant for this CPU's ISA; only once per process (a second
            # variant would register the same ops again and abort).
            current_platform.import_kernels()
        if not _kernels_loaded(torch):
            return
    except Exception:  # noqa: BLE001 - a vLLM without IR ops or these kernels: keep native
        return

    # vLLM calls general plugins outside any try (vllm/plugins/__init__.py): an exception here
    # would stop every engine process from starting, so a failed registration only logs.
    try:

        @ir.ops.rms_norm.register_impl(PROVIDER, supports_args=_plain)
        def rms_norm(
            x: torch.Tensor,
            weight: torch.Tensor | None,
            epsilon: float,
            variance_size: int | None = None,
        ) -> torch.Tensor:
            out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
            torch.ops._C.rms_norm(out, x.contiguous(), weight, epsilon)
            return out

        @ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=_plain_add, inplace=True)
        def fused_add_rms_norm(
            x: torch.Tensor,
            x_residual: torch.Tensor,
            weight: torch.Tensor | None,
            epsilon: float,
            variance_size: int | None = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            # In place, as the native op's inplace overload: x becomes the normalised sum, x_residual
            # the sum (vllm/ir/ops/layernorm.py).
            torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
            return x, x_residual
    except Exception:  # noqa: BLE001 - see above
        logging.getLogger(__name__).warning(
            "CPU RMSNorm kernels not registered; vLLM keeps its native norms", exc_info=True
        )


def registered() -> bool:
    """Whether :func:`register` has put :data:`PROVIDER` in this process's IR registry."""
    try:
        from vllm import ir  # noqa: PLC0415

        return all(PROVIDER in getattr(ir.ops, op).impls for op in OPS)
    except ImportError:
        return False
