"""Train the harm classifier's two heads and write ``moderation/data/harm_model.npz`` (issue 28).

    .venv/bin/python -m moderation.harm_train            # train, report, write the weights
    .venv/bin/python -m moderation.harm_train --check    # report only, write nothing

Training data: moderation/harm_data.py ``harm_examples("train")`` plus every text of the
prompt-injection sets' training files (``injection_train.jsonl``, ``everyday_train.jsonl``) as
category ``none`` (they hold no hazard: attacks on the instructions are the injection
classifier's concern). Features: moderation/harm.py ``Encoder`` (all-MiniLM-L6-v2). Model: one
multinomial logistic regression per head (scikit-learn, C=4, balanced class weights, fixed
seed), so the same data gives the same weights. The held-out split (``harm_examples
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

C = 4.0
REPORT_THRESHOLD = 0.9  # the default "high confidence" threshold (chatsite/settings/base.py)
NOTE_THRESHOLD = 0.5  # moderation/verdicts.py NOTE_THRESHOLD: a score noted, not acted on


def training_rows() -> list[tuple[str, str]]:
    """``[(text, category)]``: the harm training examples plus the injection training files'
    texts as ``none``."""
    from moderation.local import TRAIN_PATHS, load_examples

    rows = harm_examples("train")
    rows += [(e.text, NONE) for path in TRAIN_PATHS for e in load_examples(path)]
    return rows


def fit(features: np.ndarray, labels: list[str], categories: list[str]):
    """(coef (k, 384), intercept (k,)) of a multinomial logistic regression."""
    from sklearn.linear_model import LogisticRegression

    y = np.array([categories.index(label) for label in labels])
    model = LogisticRegression(C=C, class_weight="balanced", max_iter=5000, random_state=0)
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
        coef, intercept = fit(x_train, [c for _, c in train], categories)
        weights[f"{head}_coef"], weights[f"{head}_intercept"] = coef, intercept
        x_held = embed([t for t, _ in held])
        summary[head] = {
            "train": report(f"{head} train", softmax(x_train @ coef.T + intercept), [c for _, c in train], categories),
            "held_out": report(f"{head} held-out", softmax(x_held @ coef.T + intercept), [c for _, c in held], categories),
        }
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
