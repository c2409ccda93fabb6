"""`make demo --resume`: which partitions an earlier demo ran to success, read from a real instance's run storage."""

from __future__ import annotations

import dagster as dg

from dagster_project.demo import succeeded

PARTS = dg.StaticPartitionsDefinition(["w0", "w1", "w2"])


@dg.op(config_schema={"fail": bool})
def step(context) -> None:
    if context.op_config["fail"]:
        raise RuntimeError("this window fails")


@dg.job(partitions_def=PARTS)
def window_job():
    step()


def launch(instance, key: str, fail: bool, tags: dict) -> bool:
    return window_job.execute_in_process(partition_key=key, instance=instance, tags=tags, raise_on_error=False,
                                         run_config={"ops": {"step": {"config": {"fail": fail}}}}).success


def test_resume_skips_only_successful_runs_of_the_same_storage():
    instance = dg.DagsterInstance.ephemeral()
    mine, other = {"hir/demo": "true", "hir/storage": "/a"}, {"hir/demo": "true", "hir/storage": "/b"}
    assert launch(instance, "w0", False, mine)
    assert not launch(instance, "w1", True, mine)  # a failed run is not done
    assert launch(instance, "w2", False, other)  # another storage root's run of the same key is not ours
    assert succeeded(instance, "window_job", mine) == {"w0"}
    assert succeeded(instance, "window_job", other) == {"w2"}
    assert succeeded(instance, "another_job", mine) == set()
    assert launch(instance, "w1", False, mine)  # the retry succeeds: now done
    assert succeeded(instance, "window_job", mine) == {"w0", "w1"}


MULTI = dg.MultiPartitionsDefinition({"window": dg.StaticPartitionsDefinition(["w0", "w1"]),
                                      "objective": dg.StaticPartitionsDefinition(["click", "purchase"])})


@dg.job(partitions_def=MULTI)
def adapter_job():
    step()


def test_resume_matches_multi_partition_keys():
    instance = dg.DagsterInstance.ephemeral()
    tags = {"hir/demo": "true", "hir/storage": "/a"}
    key = dg.MultiPartitionKey({"window": "w1", "objective": "purchase"})
    assert adapter_job.execute_in_process(partition_key=key, instance=instance, tags=tags,
                                          run_config={"ops": {"step": {"config": {"fail": False}}}}).success
    done = succeeded(instance, "adapter_job", tags)
    assert key in done
    assert dg.MultiPartitionKey({"window": "w0", "objective": "purchase"}) not in done


def test_step_times_reads_each_partitions_latest_successful_run():
    from dagster_project.step_times import run_steps

    instance = dg.DagsterInstance.ephemeral()
    tags = {"hir/demo": "true", "hir/storage": "/a"}
    assert launch(instance, "w0", False, tags)
    assert not launch(instance, "w1", True, tags)  # failed: not read
    assert launch(instance, "w0", False, tags)  # a rerun of w0: the latest counts, once
    runs = run_steps(instance, "window_job", tags)
    assert [r.partition for r in runs] == ["w0"]
    assert set(runs[0].steps) == {"step"} and 0 <= runs[0].steps["step"] <= runs[0].wall_s
    assert run_steps(instance, "window_job", {"hir/storage": "/b"}) == []
