"""Train the harm classifier's two heads and write ``moderation/data/harm_model.npz`` (issue 28).

    .venv/bin/python -m moderation.harm_train            # train, report, write the weights
    .venv/bin/python -m moderation.harm_train --check    # report only, write nothing

Training data: moderation/harm_data.py ``harm_examples("train")`` plus every text of the
prompt-injection sets' training files (``injection_train.jsonl``, ``everyday_train.jsonl``) as
category ``none`` (they hold no hazard: attacks on the instructions are the injection
classifier's concern). Features: moderation/harm.py ``Encoder`` (all-MiniLM-L6-v2). Model: one
multinomial logistic regression per head (scikit-learn, C=1 chosen by grouped cross-validation, balanced class weights, fixed
seed), so the same data gives the same weights. A third, binary head (the *injection* head)
reads the same sentence embedding and is trained on the injection training files alone
(label 1: attack); moderation/local.py ``injection_probability`` asks it to agree with the
TF-IDF classifier before a short message is refused as an injection. Its held-out numbers are
on ``injection_eval.jsonl`` and ``everyday_eval.jsonl``, never trained on. The held-out split (``harm_examples
("held_out")``) is only reported, never used to choose anything; the report goes to stdout and
``moderation/data/harm_model.json`` (train / held-out recall per category at ``threshold``,
false alarms on held-out benign texts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter

import numpy as np

from moderation.harm import MODEL_PATH, NONE, Encoder, category_scores, softmax
from moderation.harm_data import harm_examples

C = 1.0  # contextual head: chosen by 5-fold cross-validation grouped by intent on the training set (issue 28)
STATIC_C = 4.0  # static head (the screen): sharper, so everyday windows stay under SCREEN_THRESHOLD
INJECTION_C = 16.0  # injection head: chosen by 5-fold cross-validated accuracy on its training files (1: 0.846, 4: 0.860, 16: 0.873)
REPORT_THRESHOLD = 0.9  # the default "high confidence" threshold (chatsite/settings/moderation.py)
NOTE_THRESHOLD = 0.5  # moderation/verdicts.py NOTE_THRESHOLD: a score noted, not acted on


def training_rows() -> list[tuple[str, str]]:
    """``[(text, category)]``: the harm training examples plus the injection training files'
    texts as ``none``."""
    from moderation.local import TRAIN_PATHS, load_examples

    rows = harm_examples("train")
    rows += [(e.text, NONE) for path in TRAIN_PATHS for e in load_examples(path)]
    return rows


def fit(features: np.ndarray, labels: list[str], categories: list[str], c: float = C):
    """(coef (k, 384), intercept (k,)) of a multinomial logistic regression (inverse
    regularisation ``c``)."""
    from sklearn.linear_model import LogisticRegression

    y = np.array([categories.index(label) for label in labels])
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000, random_state=0)
    model.fit(features, y)
    return model.coef_.astype(np.float32), model.intercept_.astype(np.float32)


def report(name: str, probs: np.ndarray, labels: list[str], categories: list[str]) -> dict:
    """Scored as at run time (moderation/harm.py ``category_scores``). Per category: the
    share of its texts whose own category scores >= ``REPORT_THRESHOLD`` (what blocks) and
    whose highest hazard score is >= ``NOTE_THRESHOLD`` (detected, any category); false
    alarms: benign texts with a hazard score >= ``REPORT_THRESHOLD``."""
    none = categories.index(NONE)
    scores = category_scores(probs, none)
    harm = np.delete(scores, none, axis=1).max(axis=1)
    out: dict = {"n": len(labels), "recall": {}, "detected": {}, "false_alarms": 0, "benign": 0}
    for col, category in enumerate(categories):
        rows = [i for i, label in enumerate(labels) if label == category]
        if category == NONE:
            out["benign"] = len(rows)
            out["false_alarms"] = int((harm[rows] >= REPORT_THRESHOLD).sum())
        elif rows:
            out["recall"][category] = round(float((scores[rows, col] >= REPORT_THRESHOLD).mean()), 3)
            out["detected"][category] = round(float((harm[rows] >= NOTE_THRESHOLD).mean()), 3)
    print(f"{name}: {out['n']} texts; own category >= {REPORT_THRESHOLD} / any hazard >= "
          f"{NOTE_THRESHOLD}: "
          + ", ".join(f"{c} {r:.2f}/{out['detected'][c]:.2f}" for c, r in out["recall"].items())
          + f"; benign >= {REPORT_THRESHOLD}: {out['false_alarms']} of {out['benign']}")
    return out


def injection_head(encoder: Encoder):
    """(coef (1, 384), intercept (1,), report) of the binary injection head: logistic regression
    (``INJECTION_C``, balanced) on the contextual embeddings of the injection training files; the report
    gives held-out accuracy on the injection evaluation set and the share of held-out everyday
    requests it rates >= 0.5."""
    from sklearn.linear_model import LogisticRegression

    from moderation.local import EVAL_PATH, EVERYDAY_EVAL_PATH, TRAIN_PATHS, load_examples

    def embed(texts):
        return np.vstack([encoder.contextual(texts[i:i + 64]) for i in range(0, len(texts), 64)])

    examples = [e for path in TRAIN_PATHS for e in load_examples(path)]
    model = LogisticRegression(C=INJECTION_C, class_weight="balanced", max_iter=5000, random_state=0)
    model.fit(embed([e.text for e in examples]), [e.label for e in examples])
    held = load_examples(EVAL_PATH)
    predicted = model.predict_proba(embed([e.text for e in held]))[:, 1] >= NOTE_THRESHOLD
    labels = np.array([e.label for e in held]).astype(bool)
    everyday = model.predict_proba(embed([e.text for e in load_examples(EVERYDAY_EVAL_PATH)]))[:, 1]
    out = {"train": len(examples), "held_out_recall": round(float(predicted[labels].mean()), 3),
           "held_out_false_alarms": int(predicted[~labels].sum()), "held_out_benign": int((~labels).sum()),
           "everyday_flagged": int((everyday >= NOTE_THRESHOLD).sum()), "everyday": len(everyday)}
    print("injection head held-out:", out)
    return model.coef_.astype(np.float32), model.intercept_.astype(np.float32), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report only, write nothing")
    args = parser.parse_args(argv)
    encoder = Encoder()
    train = training_rows()
    held = harm_examples("held_out")
    categories = sorted({c for _, c in train})
    print("training examples:", dict(Counter(c for _, c in train)))
    weights = {"categories": np.array(categories)}
    summary: dict = {"threshold": REPORT_THRESHOLD, "C": C, "train_counts": dict(Counter(c for _, c in train)),
                     "held_out_counts": dict(Counter(c for _, c in held))}
    for head, embed in (("static", encoder.static), ("contextual", encoder.contextual)):
        x_train = np.vstack([embed([t for t, _ in train[i:i + 64]]) for i in range(0, len(train), 64)])
        coef, intercept = fit(x_train, [c for _, c in train], categories,
                              STATIC_C if head == "static" else C)
        weights[f"{head}_coef"], weights[f"{head}_intercept"] = coef, intercept
        x_held = embed([t for t, _ in held])
        summary[head] = {
            "train": report(f"{head} train", softmax(x_train @ coef.T + intercept), [c for _, c in train], categories),
            "held_out": report(f"{head} held-out", softmax(x_held @ coef.T + intercept), [c for _, c in held], categories),
        }
    coef, intercept, summary["injection"] = injection_head(encoder)
    weights["injection_coef"], weights["injection_intercept"] = coef, intercept
    digest = hashlib.sha256(json.dumps(train).encode()).hexdigest()[:8]
    weights["version"] = np.array(f"harm-2026-12+{digest}")
    summary["version"] = str(weights["version"])
    if not args.check:
        np.savez_compressed(MODEL_PATH, **weights)
        MODEL_PATH.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {MODEL_PATH} ({MODEL_PATH.stat().st_size // 1024} KiB), version {summary['version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
