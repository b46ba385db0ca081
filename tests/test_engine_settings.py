"""Issue 9's engine levers: the CHAT_ENGINE_* settings reach vLLM's AsyncEngineArgs, and a bad
value stops the start with a message naming the variable (no engine is started here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference.engine import EngineUnavailable, VllmEngine
from inference.tuning import EngineTuning


def engine_kwargs() -> dict:
    return VllmEngine.from_settings().engine_args_kwargs()


def test_defaults_are_the_measured_winners(settings):
    # Given: the settings module's values with no CHAT_ENGINE_* variable set (read in a fresh
    # interpreter, so this process's environment cannot leak in)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_ENGINE_")}
    script = (
        "import json, chatsite.settings.base as b; print(json.dumps({k: getattr(b, k) for k in "
        "dir(b) if k.startswith('CHAT_ENGINE_')}))"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
    for name, value in json.loads(out.stdout).items():
        if name not in ("CHAT_ENGINE_CLASS", "CHAT_ENGINE_URL", "CHAT_ENGINE_API_KEY"):
            setattr(settings, name, tuple(value) if isinstance(value, list) else value)
    # When: the engine's arguments are built
    kwargs = engine_kwargs()
    # Then: the winners of the measured levers (docs/engine-tuning.md): eager (start in ~30 s),
    # the dtype this CPU computes fastest in, prefix caching, vLLM's blocks; n-gram speculation
    # stays opt-in until the real-engine suite has run with it (settings/engine.py)
    assert kwargs["enforce_eager"] is True
    assert kwargs["dtype"] in ("bfloat16", "float32")
    assert "speculative_config" not in kwargs
    assert kwargs["enable_prefix_caching"] is True
    assert "block_size" not in kwargs  # vLLM's CPU default (128)
    assert "max_num_batched_tokens" not in kwargs
    assert kwargs["model"] == str(settings.CHAT_MODEL_PATH)  # no quantised weights


def test_auto_dtype_is_float32_without_native_bf16(settings, monkeypatch):
    # Given: a CPU without AVX-512 BF16 or AMX (this machine's AMD EPYC: AVX2 only)
    import torch

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    settings.CHAT_ENGINE_DTYPE = "auto"
    # When / Then: float32 (vLLM's bf16 matmuls would take PyTorch's slow fallback)
    assert engine_kwargs()["dtype"] == "float32"


def test_auto_dtype_is_bfloat16_with_native_bf16(settings, monkeypatch):
    # Given: a CPU with AVX-512 BF16
    import torch

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    settings.CHAT_ENGINE_DTYPE = "auto"
    # When / Then
    assert engine_kwargs()["dtype"] == "bfloat16"


def test_every_lever_reaches_the_engine_args(settings, tmp_path):
    # Given: every lever set away from its default
    settings.CHAT_ENGINE_EAGER = False
    settings.CHAT_ENGINE_COMPILE_SIZES = (1, 2, 4)
    settings.CHAT_ENGINE_DTYPE = "float32"
    settings.CHAT_ENGINE_BLOCK_SIZE = 64
    settings.CHAT_ENGINE_MAX_BATCHED_TOKENS = 512
    settings.CHAT_ENGINE_SPECULATIVE = '{"method": "ngram", "num_speculative_tokens": 2}'
    settings.CHAT_ENGINE_PREFIX_CACHING = False
    # When
    kwargs = engine_kwargs()
    # Then
    assert kwargs["enforce_eager"] is False
    assert kwargs["compilation_config"] == {"compile_sizes": [1, 2, 4]}
    assert kwargs["dtype"] == "float32"
    assert kwargs["block_size"] == 64
    assert kwargs["max_num_batched_tokens"] == 512
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 2}
    assert kwargs["enable_prefix_caching"] is False


def test_speculative_off_leaves_it_out(settings):
    # Given: speculative decoding switched off
    settings.CHAT_ENGINE_SPECULATIVE = "off"
    # When / Then
    assert "speculative_config" not in engine_kwargs()


def test_engine_args_are_accepted_by_vllm(settings):
    # Given: the levers set (vLLM's own dataclass checks the argument names and types)
    from vllm import AsyncEngineArgs

    settings.CHAT_ENGINE_BLOCK_SIZE = 64
    settings.CHAT_ENGINE_MAX_BATCHED_TOKENS = 512
    settings.CHAT_ENGINE_SPECULATIVE = '{"method": "ngram", "num_speculative_tokens": 3}'
    # When
    args = AsyncEngineArgs(**engine_kwargs())
    # Then
    assert args.block_size == 64
    assert args.max_num_batched_tokens == 512
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}


def test_quantization_loads_the_quantised_sibling_folder(settings, tmp_path):
    # Given: a model folder and its w8a8 sibling (as inference/quantize.py writes it)
    model = tmp_path / "SmolLM2"
    quantized = tmp_path / "SmolLM2-w8a8"
    for folder in (model, quantized):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    settings.CHAT_MODEL_PATH = model
    settings.CHAT_ENGINE_QUANTIZATION = "w8a8"
    # When
    kwargs = engine_kwargs()
    # Then: weights from the sibling, the tokenizer from the model folder
    assert kwargs["model"] == str(quantized)
    assert kwargs["tokenizer"] == str(model)


def _model_with_sibling(tmp_path, variant: str | None):
    model = tmp_path / "SmolLM2"
    model.mkdir()
    (model / "config.json").write_text("{}")
    if variant:
        sibling = tmp_path / f"SmolLM2-{variant}"
        sibling.mkdir()
        (sibling / "config.json").write_text("{}")
    return model


@pytest.mark.parametrize("flag", ["amx_int8", "avx512_vnni"])
def test_auto_quantization_serves_int8_where_the_cpu_has_int8_units(settings, tmp_path,
                                                                    monkeypatch, flag):
    # Given: a CPU with int8 matrix units and the w8a8 copy `make model` writes
    from inference import quantize

    monkeypatch.setattr(quantize, "cpu_flags", lambda: {"avx2", "avx512f", flag})
    settings.CHAT_MODEL_PATH = _model_with_sibling(tmp_path, "w8a8")
    settings.CHAT_ENGINE_QUANTIZATION = "auto"
    # When
    kwargs = engine_kwargs()
    # Then
    assert kwargs["model"] == str(tmp_path / "SmolLM2-w8a8")
    assert "w8a8" in EngineTuning.from_settings().describe()


def test_auto_quantization_keeps_unquantised_weights_on_avx2(settings, tmp_path, monkeypatch):
    # Given: an AVX2-only CPU (no VNNI: int8 GEMMs are slower than float32 there), even with a
    # w8a8 copy on disk
    from inference import quantize

    monkeypatch.setattr(quantize, "cpu_flags", lambda: {"avx", "avx2", "fma", "f16c"})
    settings.CHAT_MODEL_PATH = _model_with_sibling(tmp_path, "w8a8")
    settings.CHAT_ENGINE_QUANTIZATION = "auto"
    # When / Then
    assert engine_kwargs()["model"] == str(settings.CHAT_MODEL_PATH)


def test_auto_quantization_without_the_copy_serves_unquantised_and_says_so(settings, tmp_path,
                                                                           monkeypatch, caplog):
    # Given: an int8-capable CPU, but a model folder of the user's own with no w8a8 sibling
    from inference import quantize

    monkeypatch.setattr(quantize, "cpu_flags", lambda: {"amx_int8"})
    settings.CHAT_MODEL_PATH = _model_with_sibling(tmp_path, None)
    settings.CHAT_ENGINE_QUANTIZATION = "auto"
    # When
    kwargs = engine_kwargs()
    # Then: the unquantised weights (auto never stops the start), with a warning saying how,
    # and the start's log line says what is served
    assert kwargs["model"] == str(settings.CHAT_MODEL_PATH)
    assert "make model" in caplog.text
    tuning = EngineTuning.from_settings()
    assert "auto -> none" in tuning.describe(str(settings.CHAT_MODEL_PATH))


def test_quantize_command_makes_nothing_for_auto_on_avx2(tmp_path, monkeypatch, capsys):
    # Given: `make model`'s call with the default (auto) on an AVX2-only CPU
    from inference import quantize

    monkeypatch.setattr(quantize, "cpu_flags", lambda: {"avx2"})
    model = _model_with_sibling(tmp_path, None)
    # When
    assert quantize.main(["--variant", "auto", str(model)]) == 0
    # Then: no copy written, and the reason printed
    assert not (tmp_path / "SmolLM2-w8a8").exists()
    assert "no int8 matrix units" in capsys.readouterr().out


def test_none_means_unquantised(settings, tmp_path):
    settings.CHAT_MODEL_PATH = _model_with_sibling(tmp_path, "w8a8")
    settings.CHAT_ENGINE_QUANTIZATION = "none"
    assert engine_kwargs()["model"] == str(settings.CHAT_MODEL_PATH)


def test_missing_quantised_folder_says_how_to_make_it(settings, tmp_path):
    # Given: quantisation asked for, but `make model` never wrote the folder
    settings.CHAT_MODEL_PATH = tmp_path / "SmolLM2"
    settings.CHAT_ENGINE_QUANTIZATION = "w8a8"
    # When / Then
    with pytest.raises(EngineUnavailable, match="make model CHAT_ENGINE_QUANTIZATION=w8a8"):
        engine_kwargs()


def test_four_bit_weights_on_an_avx2_cpu_are_refused_before_loading(settings, tmp_path,
                                                                     monkeypatch):
    # Given: w4a16 asked for on a CPU without AVX-512 (vLLM's AVX2 kernels lack cpu_gemm_wna16)
    import torch

    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    settings.CHAT_MODEL_PATH = tmp_path / "SmolLM2"
    settings.CHAT_ENGINE_QUANTIZATION = "w4a16"
    # When / Then: a message naming the setting and the reason, not a worker crash
    with pytest.raises(EngineUnavailable, match="CHAT_ENGINE_QUANTIZATION=w4a16.*AVX-512"):
        engine_kwargs()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CHAT_ENGINE_BLOCK_SIZE", 100, "multiple of 32"),
        ("CHAT_ENGINE_BLOCK_SIZE", -32, "multiple of 32"),
        ("CHAT_ENGINE_DTYPE", "int8", "bfloat16"),
        ("CHAT_ENGINE_THREADS_BIND", "all the cores", "CPU ids"),
        ("CHAT_ENGINE_RESERVED_CPUS", -1, ">= 0"),
        ("CHAT_ENGINE_MAX_BATCHED_TOKENS", -5, "positive"),
        ("CHAT_ENGINE_SPECULATIVE", "eagle", "ngram"),
        ("CHAT_ENGINE_SPECULATIVE", '{"method": "draft_model"}', "ngram"),
        ("CHAT_ENGINE_SPECULATIVE", '{"method": "ngram", "num_speculative_tokens": 0}', ">= 1"),
        ("CHAT_ENGINE_QUANTIZATION", "gptq", "w4a16"),
        ("CHAT_ENGINE_COMPILE_SIZES", (0,), "batch sizes"),
    ],
)
def test_bad_value_names_the_variable(settings, name, value, message):
    # Given: one lever set to a value vLLM cannot use
    setattr(settings, name, value)
    # When / Then: a configuration error naming the variable and what it accepts
    with pytest.raises(ImproperlyConfigured, match=name) as excinfo:
        EngineTuning.from_settings()
    assert message in str(excinfo.value)


def test_threads_bind_goes_to_vllms_environment(settings, monkeypatch):
    # Given: both CPU cores for the model's threads, none reserved
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    settings.CHAT_ENGINE_THREADS_BIND = "0-1"
    settings.CHAT_ENGINE_RESERVED_CPUS = 0
    # When: the engine is about to start
    EngineTuning.from_settings().apply_process_env()
    # Then: the spawned engine processes inherit vLLM's variables
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_unset_threads_bind_leaves_vllms_default(settings, monkeypatch):
    # Given: no binding settings
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    settings.CHAT_ENGINE_THREADS_BIND = ""
    settings.CHAT_ENGINE_RESERVED_CPUS = None
    # When
    EngineTuning.from_settings().apply_process_env()
    # Then: vLLM decides (auto binding)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_bad_value_stops_the_server_start_with_a_system_check(settings):
    # Given: a bad lever (daphne runs the "chat" checks at start: chatsite/asgi.py)
    from django.core import checks

    settings.CHAT_ENGINE_BLOCK_SIZE = 100
    # When
    errors = [e for e in checks.run_checks(tags=["chat"]) if e.id == "chat.E003"]
    # Then: one error naming the variable
    assert len(errors) == 1
    assert "CHAT_ENGINE_BLOCK_SIZE=100" in errors[0].msg


def test_shipped_settings_pass_the_system_check():
    from django.core import checks

    assert not [e for e in checks.run_checks(tags=["chat"]) if e.id == "chat.E003"]
