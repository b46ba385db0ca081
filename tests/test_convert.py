"""inference.convert: the shipped GGUF becomes a folder vLLM loads, once."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from inference import convert


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    dest = tmp_path_factory.mktemp("models") / "smollm2"
    source = convert.gguf_source_path()
    convert.convert(source, dest)
    return source, dest


def test_conversion_writes_dense_weights_config_and_chat_template(converted):
    _, dest = converted
    config = json.loads((dest / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert "quantization_config" not in config  # dense weights: no GGUF loader wanted
    with safe_open(str(dest / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        embed = weights.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names  # tied to the embedding
    assert tuple(embed.shape) == (config["vocab_size"], config["hidden_size"])
    assert embed.float().abs().sum() > 0
    tokenizer_files = {p.name for p in dest.iterdir()}
    assert "tokenizer.json" in tokenizer_files
    assert "chat_template.jinja" in tokenizer_files or "chat_template" in (
        dest / "tokenizer_config.json"
    ).read_text()


def test_second_conversion_is_a_no_op(converted):
    source, dest = converted
    before = (dest / "model.safetensors").stat().st_mtime_ns
    assert convert.is_converted(dest, source)
    convert.convert(source, dest)
    assert (dest / "model.safetensors").stat().st_mtime_ns == before


def test_incomplete_folder_is_not_taken_for_a_conversion(converted, tmp_path):
    source, dest = converted
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((dest / "config.json").read_text())
    assert not convert.is_converted(partial, source)
    (partial / convert.MARKER).write_text((dest / convert.MARKER).read_text())
    assert not convert.is_converted(partial, source)  # marker but no weights


def test_chat_template_renders_roles(converted):
    from transformers import AutoTokenizer

    _, dest = converted
    tokenizer = AutoTokenizer.from_pretrained(str(dest))
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "S" in text and "U" in text
    assert text.rstrip().endswith("assistant")
