"""Layouts in a sweep (common.sweep submit --nodes): one size at several node counts, each its own cell with the
same resources for every backend, kept apart in the plan, the manifest, status and extend. No Slurm, no TensorFlow."""

from __future__ import annotations

import json

import pytest

from common.sweep import cli, plan
from common.sweep import layout as sweep_layout
from common.sweep import order as sweep_order
from tests.conftest import SMOKE
from tests.test_sweep_order import fake_sbatch


def names(lays: list[dict[str, int]]) -> list[str]:
    return [sweep_layout.layout_name(lay) for lay in lays]


def test_layouts_per_size_and_node_count():
    # 2 GPUs per node, --nodes 1,2: size 1 fits one node only, size 2 both ways, size 4 needs both nodes
    assert names(sweep_layout.layouts(1, 2, [1, 2])) == ["1x1"]
    assert sweep_layout.layouts(2, 2, [1, 2]) == [{"nodes": 1, "ntasks_per_node": 2, "gpus_per_node": 2},
                                                  {"nodes": 2, "ntasks_per_node": 1, "gpus_per_node": 1}]
    assert names(sweep_layout.layouts(4, 2, [1, 2])) == ["2x2"]
    assert names(sweep_layout.layouts(8, 4, [2, 1, 4])) == ["2x4", "4x2"]  # the listed order
    assert names(sweep_layout.layouts(4, 0, [1, 2])) == ["1x4", "2x2"]  # no GPUs: no per-node limit
    # without --nodes: the fewest whole nodes, as before
    assert names(sweep_layout.layouts(8, 4, None)) == ["2x4"] and names(sweep_layout.layouts(2, 4, None)) == ["1x2"]
    with pytest.raises(sweep_layout.SweepError, match=r"--nodes 1,2: world size 8 fits none .* at most 2 rank"):
        sweep_layout.layouts(8, 2, [1, 2])
    with pytest.raises(sweep_layout.SweepError, match="world size 3 fits none"):
        sweep_layout.layouts(3, 4, [2])


def _plan(tmp_path, *extra: str):
    return plan.plan(cli.parser().parse_args(
        ["submit", "--job", SMOKE, "--sizes", "1,2,4", "--nodes", "1,2", "--gres-per-node", "2", "--results",
         str(tmp_path / "sw"), *extra]))


def test_plan_keeps_1x2_and_2x1_apart_with_identical_resources_per_layout(tmp_path):
    runs, header = _plan(tmp_path, "--repeats", "3", "--order-seed", "2")
    cells = ["native-1x1", "horovod-1x1", "native-1x2", "horovod-1x2", "native-2x1", "horovod-2x1",
             "native-2x2", "horovod-2x2"]
    assert header["cells"] == cells and header["nodes"] == [1, 2]
    assert len(runs) == 24 and [(r["cell"], r["round"] - 1) for r in runs] == sweep_order.interleave(cells, 3, 2)
    assert all(a["cell"] != b["cell"] for a, b in zip(runs, runs[1:])), "consecutive jobs change cell"
    by_cell = {r["cell"]: r for r in runs}
    assert by_cell["native-1x2"]["resources"][:3] == ["--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"]
    assert by_cell["native-2x1"]["resources"][:3] == ["--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1"]
    assert {by_cell["native-2x1"]["size"], by_cell["native-1x2"]["size"]} == {2}
    for lay in ("1x1", "1x2", "2x1", "2x2"):  # a fair fight: the same sbatch resources for both backends
        assert by_cell[f"native-{lay}"]["resources"] == by_cell[f"horovod-{lay}"]["resources"]
        assert by_cell[f"native-{lay}"]["layout"] == lay


def test_bad_nodes_is_one_line_exit_2(tmp_path, capsys):
    for nodes, message in (("0", "--nodes: a node count must be >= 1"), ("1,x", "--nodes: 'x' is not an integer"),
                           ("2", "--nodes 2: world size 1 fits none")):
        with pytest.raises(SystemExit) as e:
            cli.main(["submit", "--job", SMOKE, "--sizes", "1,2", "--nodes", nodes, "--results",
                        str(tmp_path / "sw"), "--dry-run"])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "sw").exists()


def test_status_and_extend_carry_the_layout(tmp_path, capsys, monkeypatch):
    fake_sbatch(tmp_path, monkeypatch)
    root = tmp_path / "sw"
    assert cli.main(["submit", "--job", SMOKE, "--sizes", "2", "--nodes", "1,2", "--gres-per-node", "2",
                       "--results", str(root), "--repeats", "2", "--backends", "native"]) == 0
    assert cli.main(["extend", str(root)]) == 0
    m = json.loads((root / plan.MANIFEST).read_text())
    assert [(r["cell"], r["round"] - 1) for r in m["runs"]] == sweep_order.interleave(
        ["native-1x2", "native-2x1"], 3, 0)
    assert {r["cell"]: r["resources"][0] for r in m["runs"]} == {"native-1x2": "--nodes=1", "native-2x1": "--nodes=2"}
    capsys.readouterr()
    cli.main(["status", str(root)])  # no Slurm to ask and no results: every run unknown
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["backend", "size", "layout"]
    assert sorted(ln.split()[2] for ln in table[1:7]) == ["1x2"] * 3 + ["2x1"] * 3
    assert "native-2x1  done 0/3" in "\n".join(table)
