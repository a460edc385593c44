"""Slurm task layout (common.cluster.slurm_layout): hostlists, block/cyclic placement, the own-entry check, and the case
where TensorFlow's SlurmClusterResolver gets the order wrong (string-sorted node names)."""

from __future__ import annotations

import pytest

from common.cluster.slurm_layout import (
    LayoutError,
    expand_hostlist,
    expand_tasks_per_node,
    node_distribution,
    step_workers,
    task_layout,
)


@pytest.mark.parametrize("expr,names", [
    ("localhost", ["localhost"]),
    ("n[01-03,07]", ["n01", "n02", "n03", "n07"]),
    ("n[1-2,010]", ["n1", "n2", "n010"]),  # each range keeps its own zero padding
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("n[9-11]", ["n9", "n10", "n11"]),  # Slurm's order, not string order
    ("r1i[0-1]n[0-1]", ["r1i0n0", "r1i0n1", "r1i1n0", "r1i1n1"]),
    ("jz[098-101]-ib", ["jz098-ib", "jz099-ib", "jz100-ib", "jz101-ib"]),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("bad", ["", "n[1-2", "n1-2]", "n[a-b]"])
def test_expand_hostlist_refuses_garbage(bad):
    with pytest.raises(LayoutError):
        expand_hostlist(bad)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(LayoutError):
        expand_tasks_per_node("two")


def test_block_and_cyclic_layouts():
    nodes, tasks = ["a", "b"], [3, 1]
    assert task_layout(nodes, tasks, "block") == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    # round robin over nodes that still have room (Slurm's cyclic)
    assert task_layout(nodes, tasks, "cyclic") == [("a", 0), ("b", 0), ("a", 1), ("a", 2)]
    with pytest.raises(LayoutError, match="not supported"):
        task_layout(nodes, tasks, "plane")


@pytest.mark.parametrize("value,dist", [(None, "block"), ("block", "block"), ("cyclic", "cyclic"),
                                        ("cyclic:block,Pack", "cyclic"), ("plane=4", "plane"), ("*:*", "block")])
def test_node_distribution(value, dist):
    env = {} if value is None else {"SLURM_DISTRIBUTION": value}
    assert node_distribution(env) == dist


def _env(procid: int, node: str, local: int, **extra: str) -> dict[str, str]:
    return {"SLURM_STEP_NODELIST": "n[9-10]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_PROCID": str(procid), "SLURMD_NODENAME": node, "SLURM_LOCALID": str(local), **extra}


def test_step_workers_block_and_cyclic():
    assert step_workers(1000, _env(2, "n10", 0)) == ["n9:1000", "n9:1001", "n10:1000", "n10:1001"]
    assert step_workers(1000, _env(1, "n10", 0, SLURM_DISTRIBUTION="cyclic")) == \
        ["n9:1000", "n10:1000", "n9:1001", "n10:1001"]


@pytest.mark.parametrize("env,needle", [
    (_env(1, "n10", 0), "launch with srun --distribution=block"),  # a cyclic placement without SLURM_DISTRIBUTION
    (_env(1, "n9", 0), "as local task 0"),
    (_env(0, "n9", 0, SLURM_DISTRIBUTION="plane=2"), "not supported"),
    (_env(0, "n9", 0, SLURM_STEP_NUM_TASKS="3"), "gives 4 tasks but the step has 3"),
])
def test_step_workers_refuses_a_layout_that_is_not_this_tasks(env, needle):
    with pytest.raises(LayoutError, match=needle):
        step_workers(1000, env)


def test_native_backend_uses_slurms_order_where_tensorflow_sorts_names(monkeypatch, capsys):
    """n9 and n10, one task each: Slurm gives rank 0 to n9; SlurmClusterResolver sorts "n10" < "n9"."""
    tf = pytest.importorskip("tensorflow")
    from backends.native_cluster import slurm_resolver

    for k, v in {"SLURM_STEP_NODELIST": "n[9-10]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NUM_TASKS": "2",
                 "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n9"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_DISTRIBUTION", raising=False)
    slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=15000, gpus_per_node=1, gpus_per_task=1,
                                                                auto_set_gpu=False)
    assert slurm.cluster_spec().as_dict()["worker"] == ["n10:15000", "n9:15000"]  # the bug this guards against
    resolver, source = slurm_resolver(tf, port_base=15000, gpus_per_node=-1, visible_gpus=0, prog="test")
    assert resolver.cluster_spec().as_dict()["worker"] == ["n9:15000", "n10:15000"]
    assert resolver.task_id == 0 and source == "slurm (twinbench layout)"
    assert "not Slurm's task layout" in capsys.readouterr().err
