"""Random forests (scikit-learn) from the features of finished jobs to what they took.

One forest per target: run time (learned on its logarithm: run times span seconds to
weeks, and an error of 2x matters alike at both ends), peak GPU memory, and mean and
spread of GPU utilisation; each is trained on the jobs that have that figure, once at
least `MIN_JOBS` have. A prediction comes with its spread across the trees (how much
they disagree) and the basis it rests on, in words. Training is CPU work: the scheduler
runs it in a thread, never on its event loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import RandomForestRegressor
from sklearn.feature_extraction import DictVectorizer

from schedd.estimator.features import Features

TARGETS = ("run_time_s", "gpu_memory_peak_mib", "gpu_util_pct", "gpu_util_std_pct")
LOG_TARGETS = frozenset({"run_time_s"})
MIN_JOBS = 20  # fewer finished jobs than this tell too little to learn a target from
TRAIN_ON_JOBS = 5000  # the most recent succeeded jobs a training learns from
TREES = 50


@dataclass(frozen=True, slots=True)
class Example:
    features: Features
    targets: Mapping[str, float]  # those known for this job, by name in TARGETS


@dataclass(frozen=True, slots=True)
class Predicted:
    value: float
    low: float  # the 10th and 90th percentile over the trees
    high: float


@dataclass(frozen=True, slots=True)
class Model:
    target: str
    vectorizer: DictVectorizer
    forest: RandomForestRegressor
    jobs: int  # trained on
    top_features: tuple[str, ...]  # the most important, most first


class Estimator:
    """The forests of one training; immutable once built."""

    def __init__(self, models: Mapping[str, Model], trained_on: int) -> None:
        self.models = dict(models)
        self.trained_on = trained_on

    @classmethod
    def train(cls, examples: Sequence[Example], seed: int = 0) -> Estimator:
        models = {}
        for target in TARGETS:
            rows = [e for e in examples if target in e.targets]
            if len(rows) < MIN_JOBS:
                continue
            models[target] = _fit(target, rows, seed)
        return cls(models, len(examples))

    def predict(self, features: Features) -> dict[str, Predicted]:
        return {target: _predict(model, features) for target, model in self.models.items()}

    def run_times(self, rows: Sequence[Features]) -> list[float] | None:
        """Predicted run times of many jobs at once; None before enough jobs finished."""
        return self.values("run_time_s", rows)

    def values(self, target: str, rows: Sequence[Features]) -> list[float] | None:
        """Predicted `target` of many jobs at once; None before enough jobs reported it."""
        model = self.models.get(target)
        if model is None or not rows:
            return None
        return [p.value for p in _predict_many(model, rows)]

    def basis(self, target: str) -> str:
        model = self.models.get(target)
        if model is None:
            return f"not learned: fewer than {MIN_JOBS} finished jobs report it"
        return (
            f"random forest of {TREES} trees on {model.jobs:,} finished jobs;"
            f" the features that count most: {', '.join(model.top_features)}"
        )


def _fit(target: str, rows: Sequence[Example], seed: int) -> Model:
    vectorizer = DictVectorizer(sparse=True)
    x = vectorizer.fit_transform([r.features for r in rows])
    y = np.array([_encode(target, r.targets[target]) for r in rows])
    forest = RandomForestRegressor(
        n_estimators=TREES, min_samples_leaf=2, random_state=seed, n_jobs=1
    )
    forest.fit(x, y)
    names = vectorizer.get_feature_names_out()
    order = np.argsort(forest.feature_importances_)[::-1][:3]
    top = tuple(_readable(str(names[i])) for i in order if forest.feature_importances_[i] > 0)
    return Model(target, vectorizer, forest, len(rows), top)


def _predict(model: Model, features: Features) -> Predicted:
    return _predict_many(model, [features])[0]


def _predict_many(model: Model, rows: Sequence[Features]) -> list[Predicted]:
    # Validated once here, so that each tree may skip it (it costs more than the tree).
    x = model.vectorizer.transform(list(rows)).astype(np.float32).tocsr()
    per_tree = np.array([tree.predict(x, check_input=False) for tree in model.forest.estimators_])
    low, high = np.percentile(per_tree, [10, 90], axis=0)
    mean = per_tree.mean(axis=0)  # what the forest predicts: the trees' mean
    t = model.target
    return [
        Predicted(_decode(t, m), _decode(t, lo), _decode(t, hi))
        for m, lo, hi in zip(mean, low, high, strict=True)
    ]


def memory_mib(predicted: float) -> int:
    """A predicted peak GPU memory as the scheduler asks for it: whole MiB, rounded up."""
    return math.ceil(predicted)


def _encode(target: str, value: float) -> float:
    return math.log(max(value, 1.0)) if target in LOG_TARGETS else value


def _decode(target: str, value: float) -> float:
    return math.exp(value) if target in LOG_TARGETS else float(value)


def _readable(name: str) -> str:
    # DictVectorizer names a one-hot column "key=value"; a number keeps its key.
    return name.replace("label.", "").rstrip("#")
