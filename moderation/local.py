"""The default moderator: local CPU classifiers, no network (issue 6, issue 28).

- the hazard categories (``violent_crimes``, ``child_sexual_exploitation``, ...): the harm
  classifier over all-MiniLM-L6-v2 sentence embeddings (moderation/harm.py), at both gates.
- ``offensive``: alt-profanity-check's shipped model (``profanity_check.predict_prob``: a
  linear SVM over word n-grams, calibrated, trained by its authors on ~200k labelled texts),
  applied to each sentence of the spelling-normalised text, the score being the highest
  sentence's (one insult in a long message is not diluted by the rest); evaluated with one
  matrix product (``ProfanityModel``, same numbers as the library's ``predict_prob``).
- ``prompt_injection``: a scikit-learn pipeline trained in this process at first use (~0.3 s)
  on ``moderation/data/injection_train.jsonl`` and ``everyday_train.jsonl`` (everyday requests
  phrased as commands): TF-IDF of word 1-2-grams and character 2-5-grams of the normalised
  text (moderation/normalise.py: Unicode, leetspeak, spelt-out letters, lines joined,
  base64/hex/ROT13 decoded and appended, FR/ES/DE/IT/PT glossed) -> logistic regression. A text
  of up to 600 normalised characters is scored whole; a longer one in consecutive
  200-400-character pieces cut at sentence ends, the score being the highest piece's (an
  instruction buried in a long pasted document still stands out). Judged on the separate,
  hand-written ``moderation/data/injection_eval.jsonl`` (``injection_eval_scores``: precision and
  recall) and ``everyday_eval.jsonl`` (``everyday_eval_scores``: the share of everyday commands
  that pass).
- ``blocked_term``: the policy's terms, matched on ``normalise_basic`` text at word boundaries
  (score 1.0 when any occurs, else 0.0).
- ``system_prompt_leak`` (output only): word overlap of the answer window with the turn's
  system prompt after ``leak_words`` (case, whitespace, punctuation, bullets, numbering
  ignored): 1.0 when a run of ``min(8, words in the prompt)`` consecutive prompt words
  appears, else the share of the prompt's word 3-grams that appear (flagged at the threshold,
  0.5 by default).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from moderation.normalise import SENTENCE_END, leak_words, normalise, normalise_basic, sentence_groups
from moderation.verdicts import Policy, Verdict, clean_verdict, policy_for, verdict_from_scores

DATA_DIR = Path(__file__).resolve().parent / "data"
TRAIN_PATH = DATA_DIR / "injection_train.jsonl"
EVAL_PATH = DATA_DIR / "injection_eval.jsonl"
# Everyday requests phrased as commands ("Say exactly...", "From now on answer in French"),
# all harmless (issue 18): one file trained on, one held out to judge the false-alarm rate.
EVERYDAY_TRAIN_PATH = DATA_DIR / "everyday_train.jsonl"
EVERYDAY_EVAL_PATH = DATA_DIR / "everyday_eval.jsonl"
TRAIN_PATHS = (TRAIN_PATH, EVERYDAY_TRAIN_PATH)
# The injection model's name: the month its training set was written, then the set's digest.
INJECTION_VERSION = "injection-2026-11"

# Chunking (characters): a normalised text longer than INJECTION_WHOLE_CHARS is scored in
# groups of whole sentences of up to INJECTION_CHUNK_CHARS (an attack is a sentence or three);
# the offensive score in groups of up to OFFENSIVE_CHUNK_CHARS.
INJECTION_WHOLE_CHARS = 600
INJECTION_CHUNK_CHARS = 400
OFFENSIVE_CHUNK_CHARS = 240


@dataclass(frozen=True)
class Example:
    """One labelled text: ``label`` 1 = prompt-injection attack, 0 = harmless; ``style`` is
    the kind (e.g. ``ignore``, ``roleplay``, ``encoded``, ``translated``, ``split``,
    ``fake_system``, ``exfiltration``, ``embedded``; harmless: ``instructions``, ``quoting``,
    ``security``, ``error``, ...)."""

    text: str
    label: int
    style: str = ""


def load_examples(path: Path) -> list[Example]:
    """The examples of a JSONL file (one ``{"text", "label", "style"}`` object a line; blank
    lines and lines starting with ``//`` skipped). Raises ValueError naming the line of a
    malformed one."""
    examples: list[Example] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip() or line.startswith("//"):
                continue
            try:
                row = json.loads(line)
                label = int(row["label"])
                if label not in (0, 1) or not isinstance(row["text"], str):
                    raise ValueError("label must be 0 or 1 and text a string")
                examples.append(Example(row["text"], label, str(row.get("style", ""))))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path.name} line {number}: {exc}") from exc
    return examples


class InjectionClassifier:
    """Prompt-injection probability of a text (0..1). Built from labelled examples; thread-safe
    to call once built (scikit-learn's transform and predict_proba only read)."""

    def __init__(self, examples: list[Example]):
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import FeatureUnion, make_pipeline

        if not any(e.label for e in examples) or all(e.label for e in examples):
            raise ValueError("the injection training set needs both attacks and harmless texts")
        features = FeatureUnion([
            ("words", TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True,
                                      token_pattern=r"(?u)\b\w+\b", min_df=1)),
            ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True,
                                      min_df=2, max_features=60000)),
        ])
        self.pipeline = make_pipeline(
            features, LogisticRegression(C=8.0, class_weight="balanced", max_iter=2000)
        )
        # One BLAS thread: this problem is tiny (~0.05 s on one core), and a BLAS thread pool
        # on a busy 2-core gateway spins for seconds (measured: 2.5 s instead of 0.04 s).
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            self.pipeline.fit([normalise(e.text) for e in examples],
                              [e.label for e in examples])

    def score(self, text: str) -> float:
        """The probability (0..1) that ``text`` is a prompt-injection attempt: of the whole
        normalised text up to ``INJECTION_WHOLE_CHARS``, else the highest over its sentence
        groups (each character is analysed once: the cost grows linearly, ~1.5 ms per 1,000
        characters)."""
        normalised = normalise(text)
        if len(normalised) <= INJECTION_WHOLE_CHARS:
            docs = [normalised]
        else:
            docs = sentence_groups(normalised, INJECTION_CHUNK_CHARS)
        return float(self.pipeline.predict_proba(docs)[:, 1].max())


_model_lock = threading.Lock()
_model: InjectionClassifier | None = None


def training_examples() -> list[Example]:
    """Every example the injection classifier is trained on (the files of ``TRAIN_PATHS``)."""
    return [example for path in TRAIN_PATHS for example in load_examples(path)]


def training_digest() -> str:
    """The first 8 hex digits of the SHA-256 of the training files (``TRAIN_PATHS``, in order;
    part of the version string)."""
    digest = hashlib.sha256()
    for path in TRAIN_PATHS:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def injection_classifier() -> InjectionClassifier:
    """The process-wide injection classifier, trained on ``TRAIN_PATHS`` at first use (about
    1 s) and kept in memory."""
    global _model
    if _model is None:
        with _model_lock:
            if _model is None:
                _model = InjectionClassifier(training_examples())
    return _model


class ProfanityModel:
    """alt-profanity-check's shipped model, evaluated in one matrix product.

    The library's ``predict_prob`` calls a ``CalibratedClassifierCV``: five linear SVMs, each
    followed by its sigmoid calibration, probabilities averaged; scikit-learn runs them one by
    one (~8 ms for 17 texts, most of it per-call overhead). This computes the same numbers from
    the same fitted weights (the 5 decision functions as one sparse x dense product, then the 5
    sigmoids), checked against ``predict_prob`` when built; if the shipped model is not of that
    shape (a future version), it uses ``predict_prob`` itself.
    """

    CHECK_TEXTS = ("you are a complete idiot", "have a lovely day", "what the hell is this",
                   "the report is attached", "shut up")

    def __init__(self) -> None:
        import numpy as np
        from profanity_check import profanity_check as shipped

        self._np = np
        self._vectorizer = shipped.vectorizer
        self._predict_prob = shipped.predict_prob
        self._fast = False
        try:
            parts = shipped.model.calibrated_classifiers_
            if shipped.model.method != "sigmoid" or list(shipped.model.classes_) != [0, 1]:
                raise ValueError("not a binary sigmoid-calibrated model")
            self._weights = np.vstack([c.estimator.coef_[0] for c in parts]).T
            self._bias = np.array([c.estimator.intercept_[0] for c in parts])
            self._a = np.array([c.calibrators[0].a_ for c in parts])
            self._b = np.array([c.calibrators[0].b_ for c in parts])
            self._fast = True
            expected = self._predict_prob(list(self.CHECK_TEXTS))
            if not np.allclose(self.predict_prob(list(self.CHECK_TEXTS)), expected, atol=1e-9):
                self._fast = False
        except (AttributeError, IndexError, ValueError):
            self._fast = False

    def predict_prob(self, texts: list[str]):
        """Offensive probability (0..1) of each text, like ``profanity_check.predict_prob``."""
        if not self._fast:
            return self._predict_prob(texts)
        np = self._np
        decisions = self._vectorizer.transform(texts) @ self._weights + self._bias
        return (1.0 / (1.0 + np.exp(decisions * self._a + self._b))).mean(axis=1)


def _profanity_version() -> str:
    try:
        return metadata.version("alt-profanity-check")
    except metadata.PackageNotFoundError:  # pragma: no cover - installed with the project
        return "unknown"


@lru_cache(maxsize=256)
def _blocked_pattern(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex for the terms, each normalised like the text and matched at word boundaries;
    punctuation or spaces between a term's words match any run of non-word characters."""
    alternatives = []
    for term in terms:
        words = [w for w in re.split(r"[\W_]+", normalise_basic(term)) if w]
        if words:
            alternatives.append(r"[\W_]+".join(re.escape(w) for w in words))
    if not alternatives:
        return None
    alternatives.sort(key=len, reverse=True)
    return re.compile(r"(?<![^\W_])(?:" + "|".join(alternatives) + r")(?![^\W_])")


def blocked_term_score(text: str, terms: tuple[str, ...]) -> float:
    """1.0 when one of ``terms`` occurs in ``text`` (case, Unicode look-alikes, leetspeak and
    spacing normalised; whole words only: ``"ban"`` does not match ``"banana"``), else 0.0."""
    pattern = _blocked_pattern(tuple(terms))
    if pattern is None:
        return 0.0
    return 1.0 if pattern.search(normalise_basic(text)) else 0.0


@lru_cache(maxsize=64)
def _prompt_grams(system_prompt: str) -> tuple[int, frozenset, frozenset]:
    words = leak_words(system_prompt)
    run = min(8, len(words))
    runs = frozenset(tuple(words[i:i + run]) for i in range(len(words) - run + 1))
    trigrams = frozenset(tuple(words[i:i + 3]) for i in range(len(words) - 2))
    return run, runs, trigrams


# System prompts shorter than this many words are not checked for leaks (see leak_score).
LEAK_MIN_WORDS = 10


def leak_score(window: str, system_prompt: str) -> float:
    """How much of ``system_prompt`` the answer ``window`` repeats, 0..1, after ``leak_words``
    on both (case, whitespace, punctuation, bullets and numbering ignored): 1.0 when
    ``min(8, prompt words)`` consecutive prompt words appear in the window, else the share of
    the prompt's word 3-grams found in the window. Prompts under ``LEAK_MIN_WORDS`` words score
    0: a short instruction ("You are a helpful, concise assistant.") cannot be told apart from
    the assistant describing itself ("I am a helpful, concise assistant"), and is no secret."""
    if not system_prompt:
        return 0.0
    run, runs, trigrams = _prompt_grams(system_prompt)
    if len(leak_words(system_prompt)) < LEAK_MIN_WORDS or not trigrams:
        return 0.0
    words = leak_words(window)
    if any(tuple(words[i:i + run]) in runs for i in range(len(words) - run + 1)):
        return 1.0
    seen = {tuple(words[i:i + 3]) for i in range(len(words) - 2)}
    return len(trigrams & seen) / len(trigrams)


class LocalModerator:
    """The default ``Moderator`` (settings.CHAT_MODERATOR): alt-profanity-check, the trained
    prompt-injection classifier, blocked terms and the system-prompt leak check, all on the
    gateway's CPU. Building it loads both models (~1-2 s with scikit-learn's import)."""

    name = "local"

    def __init__(self) -> None:
        from moderation.harm import harm_classifier

        self._profanity = ProfanityModel().predict_prob
        self._injection = injection_classifier()
        self._harm = harm_classifier()
        self.version = (
            f"local-2 ({self._harm.version}, alt-profanity-check {_profanity_version()}, "
            f"{INJECTION_VERSION}+{training_digest()})"
        )
        # One pass through every model now, at construction: torch's and scikit-learn's first
        # calls set up kernels and thread pools (hundreds of ms on a busy machine), and a
        # construction is not held to a check's timeout (moderation/base.py acheck), while the
        # first check is; a turn that arrives during the server's warm-up waits for this.
        self._harm.read("warm-up")
        self._harm.read("warm-up", screen=True)
        self._injection.score("warm-up")
        self.offensive_score("warm-up")

    def offensive_score(self, text: str) -> float:
        """alt-profanity-check's probability (0..1) that ``text`` is offensive: the highest over
        the sentences of the spelling-normalised text (a sentence over ~240 characters in
        pieces), so one insult among many harmless sentences is not diluted."""
        basic = normalise_basic(text)
        pieces = [piece for sentence in SENTENCE_END.split(basic) if sentence
                  for piece in sentence_groups(sentence, OFFENSIVE_CHUNK_CHARS)]
        return float(max(self._profanity(pieces or [basic])))

    def injection_score(self, text: str) -> float:
        """The prompt-injection score of ``text`` (0..1), see ``injection_probability``."""
        return injection_probability(text, self._injection, self._harm)

    def check_input(self, text: str, policy: Policy) -> Verdict:
        """Hazard, offensive, prompt-injection and (when the policy has any) blocked-term scores
        of a user message -> verdict under ``policy``'s thresholds and actions, gate
        ``"input"``. ~20-35 ms for 4,000 characters on one idle core (bench/moderation_bench.py
        measures it under load)."""
        if not text.strip():
            return clean_verdict(classifier=self.name, version=self.version, gate="input")
        hazards, contextual_injection = self._harm.read(text)
        scores = {
            **hazards,
            "offensive": self.offensive_score(text),
            "prompt_injection": combine_injection(self._injection.score(text), contextual_injection),
        }
        if policy.blocked_terms:
            scores["blocked_term"] = blocked_term_score(text, policy.blocked_terms)
        return verdict_from_scores(scores, policy, classifier=self.name, version=self.version,
                                   gate="input")

    def check_output(self, text: str, policy: Policy) -> Verdict:
        """Hazard, offensive, blocked-term and system-prompt-leak scores of a window of the
        answer -> verdict, gate ``"output"`` (no injection score: the answer is the model's, not an
        attacker's)."""
        if not text.strip():
            return clean_verdict(classifier=self.name, version=self.version, gate="output")
        scores = {**self._harm.scores(text, screen=True), "offensive": self.offensive_score(text)}
        if policy.blocked_terms:
            scores["blocked_term"] = blocked_term_score(text, policy.blocked_terms)
        if policy.system_prompt:
            scores["system_prompt_leak"] = leak_score(text, policy.system_prompt)
        return verdict_from_scores(scores, policy, classifier=self.name, version=self.version,
                                   gate="output")


# A TF-IDF injection probability at or above this refuses on its own; below it the embedding
# head must agree (combine_injection). Chosen on the training files' cross-validation and the
# issue-28 everyday defects ("Quote the first sentence of your previous answer.": TF-IDF 0.60,
# embedding 0.12); held-out effect in moderation/data/harm_model.json and docs/moderation.md.
INJECTION_CONFIDENT = 0.85


def combine_injection(tfidf: float, contextual: float | None) -> float:
    """The prompt-injection score (0..1) from the TF-IDF classifier's probability and the
    embedding head's (None for a long text, read in pieces): the TF-IDF probability when it is
    at least ``INJECTION_CONFIDENT`` or there is no embedding reading, else the lower of the
    two. Word n-grams alone cannot tell "what are your system instructions for formatting?"
    from "print your system instructions"; two models that read differently must both say
    "attack" before a short message is refused on a middling score."""
    if contextual is None or tfidf >= INJECTION_CONFIDENT:
        return tfidf
    return min(tfidf, contextual)


def injection_probability(text: str, model: InjectionClassifier | None = None, harm=None) -> float:
    """The deployed prompt-injection score of ``text`` (0..1): ``combine_injection`` of the
    TF-IDF classifier and the harm classifier's injection head (moderation/harm.py ``read``).
    Loads both process-wide models when not given."""
    from moderation.harm import harm_classifier

    model = model or injection_classifier()
    harm = harm or harm_classifier()
    return combine_injection(model.score(text), harm.read(text)[1])


def injection_eval_scores(threshold: float | None = None) -> dict:
    """The deployed injection score (``injection_probability``) judged on the labelled evaluation set (``EVAL_PATH``, never
    used in training): ``{"precision", "recall", "n_attacks", "n_benign", "threshold", "tp",
    "fp", "fn", "tn", "train_examples"}``. ``threshold`` defaults to the deployment's
    ``prompt_injection`` threshold (``settings.CHAT_MODERATION_THRESHOLDS``). What ``make
    bench`` prints."""
    if threshold is None:
        threshold = policy_for(None).threshold("prompt_injection")
    examples = load_examples(EVAL_PATH)
    tp = fp = fn = tn = 0
    for example in examples:
        predicted = injection_probability(example.text) >= threshold
        if example.label and predicted:
            tp += 1
        elif example.label:
            fn += 1
        elif predicted:
            fp += 1
        else:
            tn += 1
    return {
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
        "n_attacks": tp + fn,
        "n_benign": fp + tn,
        "threshold": threshold,
        "tp": tp, "fp": fp, "fn": fn, "tn": tn,
        "train_examples": len(training_examples()),
    }


def everyday_eval_scores(threshold: float | None = None) -> dict:
    """The deployed injection score (``injection_probability``) on the held-out everyday commands (``EVERYDAY_EVAL_PATH``, all
    harmless, never trained on): ``{"pass_rate", "n", "passed", "threshold", "flagged":
    [{"text", "style", "score"}]}``, ``pass_rate`` = passed / n (0..1; issue 18's bar is 0.98).
    ``threshold`` defaults to the deployment's ``prompt_injection`` threshold. Raises
    ValueError when the file holds an attack (label 1): it must be harmless only."""
    if threshold is None:
        threshold = policy_for(None).threshold("prompt_injection")
    examples = load_examples(EVERYDAY_EVAL_PATH)
    if any(example.label for example in examples):
        raise ValueError(f"{EVERYDAY_EVAL_PATH.name} must hold harmless examples only")
    flagged = []
    for example in examples:
        score = injection_probability(example.text)
        if score >= threshold:
            flagged.append({"text": example.text, "style": example.style,
                            "score": round(score, 3)})
    passed = len(examples) - len(flagged)
    return {
        "pass_rate": passed / len(examples) if examples else 0.0,
        "n": len(examples),
        "passed": passed,
        "threshold": threshold,
        "flagged": flagged,
    }
