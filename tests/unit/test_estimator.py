"""The resource estimator: features from a spec, forests that learn what jobs take."""

from __future__ import annotations

import random

from schedd.estimator.features import features
from schedd.estimator.forest import MIN_JOBS, Estimator, Example


def job(model: str, gpus: int = 1, **labels: str) -> dict[str, float | str]:
    return features(
        user="alice",
        name="train",
        queue="default",
        gpus=gpus,
        cpus=4,
        memory_mib=8192,
        labels={"model": model, **labels},
    )


def history(n: int, seed: int = 1) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        model = rng.choice(["resnet50", "bert"])
        run = (3600.0 if model == "resnet50" else 600.0) * rng.uniform(0.9, 1.1)
        memory = 30_000.0 if model == "resnet50" else 12_000.0
        out.append(Example(job(model), {"run_time_s": run, "gpu_memory_peak_mib": memory}))
    return out


def test_a_numeric_label_is_both_a_category_and_a_number() -> None:
    f = job("bert", batch_size="64")
    assert f["label.batch_size"] == "64" and f["label.batch_size#"] == 64.0
    assert "label.model#" not in job("bert")


def test_the_forest_learns_run_time_and_memory_by_model() -> None:
    estimator = Estimator.train(history(200))
    bert, resnet = estimator.predict(job("bert")), estimator.predict(job("resnet50"))
    assert 500 < bert["run_time_s"].value < 720
    assert 3000 < resnet["run_time_s"].value < 4300
    assert bert["run_time_s"].low <= bert["run_time_s"].value <= bert["run_time_s"].high
    assert abs(resnet["gpu_memory_peak_mib"].value - 30_000) < 1_000
    assert "model=bert" in estimator.basis("run_time_s") or "model=resnet50" in estimator.basis(
        "run_time_s"
    )


def test_a_target_no_job_reports_is_not_learned_and_says_so() -> None:
    estimator = Estimator.train(history(100))
    assert "gpu_util_pct" not in estimator.predict(job("bert"))
    assert estimator.basis("gpu_util_pct").startswith("not learned")


def test_too_few_jobs_teach_nothing() -> None:
    estimator = Estimator.train(history(MIN_JOBS - 1))
    assert estimator.models == {}
    assert estimator.run_times([job("bert")]) is None


def test_batch_predictions_match_single_ones_and_training_is_repeatable() -> None:
    a, b = Estimator.train(history(120)), Estimator.train(history(120))
    rows = [job("bert"), job("resnet50", gpus=2)]
    assert a.run_times(rows) == b.run_times(rows)
    batch = a.run_times(rows)
    assert batch is not None
    single = [a.predict(r)["run_time_s"].value for r in rows]
    assert all(abs(x - y) < 1e-6 * y for x, y in zip(batch, single, strict=True))
