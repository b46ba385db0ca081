"""inference/quantize.py: the quantised copies vLLM's CPU backend loads (compressed-tensors), made
once beside the model; and the CPU check that stops an unsupported variant with a clear message.
Tiny made-up weights: no model and no engine are loaded here."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference import quantize

LINEARS = ("self_attn.q_proj", "mlp.down_proj")


def tiny_state() -> dict:
    torch.manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(32, 64, dtype=torch.bfloat16)}
    for name in LINEARS:
        state[f"model.layers.0.{name}.weight"] = torch.randn(64, 64, dtype=torch.bfloat16)
    state["model.layers.0.input_layernorm.weight"] = torch.ones(64, dtype=torch.bfloat16)
    return state


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "Tiny"
    folder.mkdir()
    save_file(tiny_state(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / ".converted-from.json").write_text(json.dumps({"size": 1}))
    return folder


def test_w8a8_stores_int8_weights_with_float32_channel_scales():
    # Given: bf16 linear weights
    # When
    state, config = quantize.quantize_state_dict(tiny_state(), "w8a8")
    # Then: int8 weights, one float32 scale per output channel, dynamic per-token activations
    weight = state["model.layers.0.self_attn.q_proj.weight"]
    scale = state["model.layers.0.self_attn.q_proj.weight_scale"]
    assert weight.dtype == torch.int8 and tuple(weight.shape) == (64, 64)
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (64, 1)
    group = config["config_groups"]["group_0"]
    assert config["format"] == "int-quantized" and config["quant_method"] == "compressed-tensors"
    assert group["input_activations"]["dynamic"] is True
    assert "lm_head" in config["ignore"]
    # and the embedding and norms are untouched
    assert state["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_w8a8_weights_dequantise_close_to_the_originals():
    # Given
    original = tiny_state()["model.layers.0.mlp.down_proj.weight"].float()
    # When
    state, _ = quantize.quantize_state_dict(tiny_state(), "w8a8")
    restored = (state["model.layers.0.mlp.down_proj.weight"].float()
                * state["model.layers.0.mlp.down_proj.weight_scale"])  # fmt: skip
    # Then: within half a quantisation step per channel
    step = original.abs().amax(dim=1, keepdim=True) / 127
    assert ((restored - original).abs() <= step / 2 + 1e-6).all()


def test_w4a16_packs_groups_of_32_with_zero_points():
    # Given / When
    state, config = quantize.quantize_state_dict(tiny_state(), "w4a16")
    prefix = "model.layers.0.self_attn.q_proj."
    # Then: 8 four-bit values per int32 along the input, a scale and zero point per group of 32
    assert state[prefix + "weight_packed"].dtype == torch.int32
    assert tuple(state[prefix + "weight_packed"].shape) == (64, 64 // 8)
    assert tuple(state[prefix + "weight_scale"].shape) == (64, 64 // 32)
    assert prefix + "weight_zero_point" in state
    assert state[prefix + "weight_shape"].tolist() == [64, 64]
    assert config["format"] == "pack-quantized"
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 32


def test_quantize_writes_the_sibling_folder_once(model_dir):
    # Given: a converted model folder
    # When: quantised twice
    dest = quantize.quantize(model_dir, "w8a8")
    first = (dest / "model.safetensors").stat().st_mtime_ns
    again = quantize.quantize(model_dir, "w8a8")
    # Then: <folder>-w8a8 with weights, a config naming the quantisation, the tokenizer files;
    # the second call is a no-op
    assert dest == model_dir.with_name("Tiny-w8a8") == again
    assert (dest / "model.safetensors").stat().st_mtime_ns == first
    config = json.loads((dest / "config.json").read_text())
    assert config["quantization_config"]["format"] == "int-quantized"
    assert (dest / "tokenizer.json").is_file()
    assert "model.layers.0.self_attn.q_proj.weight_scale" in load_file(str(dest / "model.safetensors"))
    assert quantize.is_quantized(model_dir, "w8a8")


def test_reconverted_source_is_quantised_again(model_dir):
    # Given: a quantised copy, then the source model converted again (new weights file)
    quantize.quantize(model_dir, "w8a8")
    save_file(tiny_state(), str(model_dir / "model.safetensors"))
    # When / Then: the copy no longer counts as current
    assert not quantize.is_quantized(model_dir, "w8a8")


def test_missing_source_folder_says_to_convert_first(tmp_path):
    # Given: no converted model
    # When / Then
    with pytest.raises(quantize.QuantizeError, match="make model"):
        quantize.quantize(tmp_path / "missing", "w8a8")


def test_unknown_variant_is_refused(tmp_path):
    with pytest.raises(quantize.QuantizeError, match="w8a8, w4a16"):
        quantize.quantized_path(tmp_path / "m", "int3")


def test_four_bit_weights_need_avx512(monkeypatch):
    # Given: an AVX2-only CPU (this machine: vLLM's AVX2 library has no cpu_gemm_wna16)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    # When
    supported, why = quantize.cpu_supports("w4a16")
    # Then: refused up front, with the reason and what to use instead
    assert not supported
    assert "AVX-512" in why and "w8a8" in why
    assert quantize.cpu_supports("w8a8") == (True, "")


def test_greedy_agreement_counts_positions_and_prefix():
    # Given: two runs' greedy tokens for two prompts (n = 4)
    base = {"greedy": [[1, 2, 3, 4], [5, 6, 7, 8]], "ppl": 10.0, "ppl_tokens": 9}
    other = {"greedy": [[1, 2, 9, 4], [5, 6, 7, 8]], "ppl": 10.5, "ppl_tokens": 9}
    # When
    result = quantize.compare(base, other, 4)
    # Then
    assert result["agreement"] == pytest.approx((3 / 4 + 1) / 2)
    assert result["prefix_match"] == pytest.approx((2 / 4 + 1) / 2)
    assert result["ppl_ratio"] == pytest.approx(1.05)
