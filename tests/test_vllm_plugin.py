"""The vLLM plugin's CPU RMSNorm kernels (inference/vllm_plugin.py, issue 19 part 2): registered
through vLLM's plugin entry point, numerically the native ops' results, chosen by the engine's
arguments only when ``CHAT_ENGINE_CPU_KERNELS`` is on."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
from django.core.exceptions import ImproperlyConfigured

from inference import vllm_plugin
from inference.engine import VllmEngine
from inference.quantize import cpu_flags
from inference.tuning import cpu_kernels_resolved


@pytest.fixture(scope="module")
def ir():
    vllm_plugin.register()
    from vllm import ir as vllm_ir  # noqa: PLC0415

    return vllm_ir


def _inputs(tokens: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 576, generator=generator).to(dtype)
    residual = torch.randn(tokens, 576, generator=generator).to(dtype)
    weight = torch.randn(576, generator=generator).to(dtype)
    return x, residual, weight


def test_the_plugin_is_a_vllm_general_plugin():
    # Given / When: the installed package's entry points (pyproject.toml)
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    # Then: vLLM loads it in each of its processes (vllm/plugins load_general_plugins)
    assert plugins.get("chatsite_cpu_kernels") == "inference.vllm_plugin:register"


def test_register_adds_the_cpu_provider_once(ir):
    # Given: the plugin registered (module fixture); When: registered again (vLLM may load
    # general plugins more than once per process)
    before = dict(ir.ops.rms_norm.impls)
    vllm_plugin.register()
    # Then: one provider of each op, the same objects as before
    assert vllm_plugin.registered()
    assert ir.ops.rms_norm.impls == before
    assert vllm_plugin.PROVIDER in ir.ops.fused_add_rms_norm.impls


@pytest.mark.parametrize("tokens", [1, 16, 200])
def test_rms_norm_kernel_matches_native(ir, tokens):
    # Given: bf16 activations of SmolLM2's width at decode and prefill sizes
    x, _, weight = _inputs(tokens)
    native = ir.ops.rms_norm.impls["native"].impl_fn(x, weight, 1e-5)
    # When
    kernel = ir.ops.rms_norm.impls[vllm_plugin.PROVIDER].impl_fn(x, weight, 1e-5)
    # Then: equal within bf16 rounding of values up to ~4 (2 ulp = 0.03125)
    assert kernel.dtype == torch.bfloat16 and kernel.shape == x.shape
    assert torch.allclose(kernel.float(), native.float(), atol=0.0625, rtol=0.02)


@pytest.mark.parametrize("tokens", [1, 200])
def test_fused_add_rms_norm_kernel_matches_native(ir, tokens):
    # Given
    x, residual, weight = _inputs(tokens)
    native_out, native_sum = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(
        x.clone(), residual.clone(), weight, 1e-5
    )
    # When: through the op's functional path (inputs are copied for an in-place provider)
    impl = ir.ops.fused_add_rms_norm.impls[vllm_plugin.PROVIDER]
    out, summed = impl.func_impl_fn(x, residual, weight, 1e-5)
    # Then: the same normalised sum and the same residual sum: exactly where the kernels round
    # bf16 to nearest like native (AVX-512 BF16, where `auto` turns them on), else within one
    # unit in the last place (without hardware bf16 conversion - AVX2, or AVX-512 without BF16 -
    # they truncate: why `auto` leaves them off there); the caller's tensors untouched
    if "avx512_bf16" in cpu_flags():
        assert torch.equal(summed, native_sum)
    else:
        assert torch.allclose(summed.float(), native_sum.float(), rtol=2**-7, atol=2**-7)
        lower = summed.float().abs() < native_sum.float().abs()
        assert bool(lower[summed != native_sum].all())  # truncated toward zero, never rounded up
    assert torch.allclose(out.float(), native_out.float(), atol=0.0625, rtol=0.02)
    assert not torch.equal(out, x)


def test_kernels_refuse_what_they_cannot_compute(ir):
    # Given: a float32 weight on bf16 activations, and a variance size override (other models)
    x, residual, weight = _inputs(4)
    impl = ir.ops.rms_norm.impls[vllm_plugin.PROVIDER]
    add = ir.ops.fused_add_rms_norm.impls[vllm_plugin.PROVIDER]
    # Then: the dispatcher falls through to native for them
    assert impl.supports_args(x, weight, 1e-5)
    assert not impl.supports_args(x, weight.float(), 1e-5)
    assert not impl.supports_args(x, weight, 1e-5, 64)
    assert not add.supports_args(x[:, ::2], residual[:, ::2], weight[::2], 1e-5)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [({"avx2", "avx512f", "avx512_bf16"}, True), ({"avx2", "avx512f"}, False), ({"avx2", "fma"}, False)],
)
def test_auto_turns_the_kernels_on_only_with_avx512_bf16(monkeypatch, flags, expected):
    monkeypatch.setattr("inference.quantize.cpu_flags", lambda: flags)
    assert cpu_kernels_resolved("auto") is expected
    assert cpu_kernels_resolved("1") is True and cpu_kernels_resolved("0") is False


def test_a_bad_kernels_setting_is_refused_with_what_to_write(settings):
    settings.CHAT_ENGINE_CPU_KERNELS = "sometimes"
    with pytest.raises(ImproperlyConfigured, match="auto, 1 or 0"):
        VllmEngine.from_settings()


def test_engine_asks_for_the_kernels_when_on(settings):
    # Given: the kernels switched on (the default where the CPU has AVX-512)
    settings.CHAT_ENGINE_CPU_KERNELS = True
    # When
    kwargs = VllmEngine.from_settings().engine_args_kwargs()
    # Then: the provider first for both norms (vLLM appends its platform default, native)
    assert kwargs["ir_op_priority"] == {op: [vllm_plugin.PROVIDER] for op in vllm_plugin.OPS}


def test_engine_keeps_native_norms_when_switched_off(settings):
    settings.CHAT_ENGINE_CPU_KERNELS = False
    assert "ir_op_priority" not in VllmEngine.from_settings().engine_args_kwargs()


def test_engine_args_with_the_kernels_are_accepted_by_vllm(settings):
    # Given: the kernels on; When: vLLM builds its config from the arguments
    from vllm import AsyncEngineArgs  # noqa: PLC0415

    settings.CHAT_ENGINE_CPU_KERNELS = True
    args = AsyncEngineArgs(**VllmEngine.from_settings().engine_args_kwargs())
    # Then: the priority lists arrive as vLLM's IrOpPriorityConfig
    assert list(args.ir_op_priority.rms_norm) == [vllm_plugin.PROVIDER]
