"""The task-sanity section: caveats follow the evidence, in task order, and the headline
carries every number with its interval."""

from structlens.data.tasks.sanity import TaskSanity, TaskScore, caveats, section


def _score(task, metric_ci, accuracy=0.9):
    return TaskScore(task, 32, accuracy, (0.8, 0.95), sum(metric_ci) / 2, metric_ci, "logit diff")


def test_caveats_in_task_order_and_only_where_the_metric_reaches_zero():
    result = TaskSanity(
        tasks=("ioi", "greater_than", "facts"),
        scores=(_score("greater_than", (-0.1, 0.4)), _score("facts", (0.2, 0.6))),
        unavailable=(("ioi", "no single-token names"),),
    )
    got = caveats(result)
    assert [c.kind for c in got] == ["not_run", "null_effect"]
    assert got[0].message.startswith("ioi: not available") and "single-token" in got[0].message
    assert got[1].message.startswith("greater_than:")


def test_positive_metric_everywhere_gives_no_caveat_and_a_full_headline():
    result = TaskSanity(("a", "b"), (_score("a", (0.1, 0.3)), _score("b", (1e-6, 2.0))))
    doc = section(result).to_json()
    assert doc["caveats"] == []
    assert set(doc["headline"]) == {"a_accuracy", "a_metric", "b_accuracy", "b_metric"}
    assert doc["headline"]["a_metric"]["ci"] == [0.1, 0.3]
    assert [r["task"] for r in doc["details"]["rows"]] == ["a", "b"]


def test_no_buildable_task_is_said():
    result = TaskSanity(("ioi",), (), (("ioi", "tokenizer"),))
    kinds = [c.kind for c in caveats(result)]
    assert kinds == ["not_run", "not_run"]
    assert section(result).to_json()["headline"] == {}
