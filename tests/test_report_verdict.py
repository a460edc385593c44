"""common.report.verdict: the report's first lines, per job and layout, in plain words, from fake records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.cluster import machine
from common.report.build import ReportOptions, build_report
from common.report.summary import summarize
from common.report.verdict import job_verdicts, verdict_lines
from common.workload.job import Job
from tests.test_report import make_run, put

KEPT_UP = {"method": "gap", "wait_fraction": 0.01, "kept_up": True}  # fit's input wait below the kept-up line


def cell(backend: str, ws: int, base: float, n: int = 6, **kw: Any) -> list[dict[str, Any]]:
    """``n`` repeats around ``base`` images/s (spread +-1.25%), one node of ``ws`` ranks, input kept up unless
    ``input`` says otherwise."""
    kw.setdefault("input", KEPT_UP)
    return [make_run(backend, ws, base * (1 + (i - (n - 1) / 2) * 0.005), run_id=f"{backend}-{ws}-{base}-{i}",
                     hosts=["n0"] * ws, **kw) for i in range(n)]


def test_faster_backend_with_interval_and_runs() -> None:
    (s,) = summarize(cell("native", 2, 112.0) + cell("horovod", 2, 100.0))
    (v,) = job_verdicts(s)
    assert v.layout == "1 node x 2 ranks"
    assert v.text.startswith("1 node x 2 ranks: native is 12% faster than horovod [")
    assert v.text.endswith("(6 runs each, bootstrap interval of the ratio of medians)")
    lo, hi = (float(x.rstrip("%")) for x in v.text.split("[")[1].split("]")[0].split(", "))
    assert 8 < lo < 12 < hi < 16  # the bootstrap interval of the lead around 12%


def test_no_significant_difference_and_needs_six_runs() -> None:
    runs = cell("native", 1, 100.0) + cell("horovod", 1, 100.2) + cell("native", 2, 180.0, n=3) \
        + cell("horovod", 2, 200.0, n=2)
    (s,) = summarize(runs)
    one, two = job_verdicts(s)
    assert one.text.startswith("1 node x 1 rank: no significant difference (horovod/native 1.002 [")
    assert two.text.startswith("1 node x 2 ranks: needs 6 runs per cell to say (3 native and 2 horovod runs; by "
                               "the medians alone horovod is 11% faster than native, not a verdict)")


def test_caveats_and_what_else_was_measured() -> None:
    def gpu_block(peak_gpu: int) -> dict[str, Any]:
        per = [{"host": "n0", "cpu": {"model": "C"}, "cpu_mask": 8,
                "gpu": {**machine.NO_GPU, "source": "nvml", "model": "NVIDIA A100-SXM4-40GB"},
                "libraries": {}, "slurm": None, "network": {},
                "memory": {"peak_rss_bytes": 2**30, "peak_gpu_bytes": peak_gpu + i}} for i in range(2)]
        return machine.combine(per)

    kw: dict[str, Any] = {"devices": ["/physical_device:GPU:0"] * 2}
    native = cell("native", 2, 100.0, collective={"used": "ring"}, machine=gpu_block(3 * 2**30),
                  input={"method": "fetch", "wait_fraction": 0.3, "kept_up": False, "input_bound": "highly"}, **kw)
    horovod = cell("horovod", 2, 150.0, collective={"used": "nccl"}, machine=gpu_block(5 * 2**29),
                   energy={"gpu_joules": 320.0, "scope": "GPU only"}, **kw)
    (s,) = summarize(native + horovod)
    (v,) = job_verdicts(s)
    assert "horovod is 50% faster than native" in v.text
    assert "peak memory per rank native 3.0 GiB GPU, horovod 2.5 GiB GPU" in v.text
    # 320 J over 10 timed steps of 32 images: 1 J per image; native measured none (n/a, not zero)
    assert "GPU energy per image (GPU only) native n/a, horovod 1 J" in v.text
    assert "Caveats: collectives not like for like (native ring vs horovod nccl on GPUs); native highly input-bound" \
        in v.text


def test_host_memory_on_a_cpu_and_no_energy() -> None:
    block = machine.combine([{"host": "n0", "cpu": {"model": "C"}, "gpu": dict(machine.NO_GPU),
                              "memory": {"peak_rss_bytes": 800 * 2**20, "peak_gpu_bytes": None}}])
    (s,) = summarize(cell("native", 1, 100.0, machine=block) + cell("horovod", 1, 90.0, machine=block))
    (v,) = job_verdicts(s)
    assert "peak memory per rank native 800 MiB host RSS, horovod 800 MiB host RSS" in v.text
    assert "energy" not in v.text and s.rows[0].resources.energy_j is None


def test_verdict_opens_report_md_and_html_and_ends_the_printed_output(tmp_path: Path, capsys: Any) -> None:
    from common.report.cli import main

    d = tmp_path / "r"
    for rec in cell("native", 2, 112.0) + cell("horovod", 2, 100.0) + cell("horovod", 1, 60.0, n=1):
        put(d, rec)
    build_report(d, options=ReportOptions(plots=False))
    md = (d / "report" / "report.md").read_text()
    assert md.index("## Verdict") < md.index("## Method")
    assert "- 1 node x 2 ranks: native is 12% faster than horovod [" in md
    assert "- 1 node x 1 rank: only horovod ran, no comparison" in md
    html = (d / "report" / "report.html").read_text()
    assert html.index("<h2>Verdict</h2>") < html.index("<h2>Method</h2>")
    assert "<li>1 node x 2 ranks: native is 12% faster than horovod [" in html
    assert main([str(d), "--no-plots"]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("  1 node x 2 ranks: native is 12% faster") and out[-4].startswith("small (")
    assert out[-3].startswith("  CPUs only (every run's devices: cpu)")  # what the verdict cannot tell, first
    lone = verdict_lines(summarize(cell("native", 1, 1.0, n=1)))
    assert lone == ["small (90b23b6c798ed8f6), horovod vs native:", "  1 node x 1 rank: only native ran, no comparison"]


def test_runs_whose_ranks_got_the_same_first_batches_carry_a_caveat() -> None:
    """An input function that does not shard (every rank's fingerprint of its first batches equal) is a caveat of
    the verdict and a note; sharded ranks (different fingerprints) and one-rank runs are not."""
    def pipeline(*prints: str) -> dict[str, Any]:
        return {"method": "fetch", "pipeline": {"per_rank": [{"fingerprint": p} for p in prints]}}

    runs = cell("native", 2, 100.0, n=2, input=pipeline("aa", "aa")) + cell("horovod", 2, 100.0, n=2,
                                                                              input=pipeline("aa", "bb"))
    runs += cell("native", 1, 50.0, n=1, input=pipeline("aa")) + cell("horovod", 1, 50.0, n=1, input=pipeline("aa"))
    (s,) = summarize(runs)
    one, two = job_verdicts(s)
    assert "same first batches" not in one.text
    assert two.text.endswith("Caveats: native's ranks all got the same first batches in 2 of 2 run(s): its input "
                             "function does not shard, every worker trained on the same data"), two.text
    assert [n for n in s.notes if "same first batches" in n] == [
        "native at 2 replicas: in 2 of 2 repeat(s) every rank got the same first batches (the input function's "
        "fingerprints, input.pipeline): it does not shard by input_context.input_pipeline_id, so the workers trained "
        "on the same data"]


def test_best_vs_best_never_compares_two_layouts() -> None:
    """Horovod's fastest variant ran 2x1, native's only 1x2: at 2 replicas there is no best vs best ratio, and the
    verdict of each layout names no variant of the other."""
    from common.report.verdict import best_ratios, best_rows

    fusion = {"variant": "fusion 32 MiB"}
    runs = cell("native", 2, 9447.0) + cell("horovod", 2, 6941.0, tuning=fusion)
    runs += cell("horovod", 2, 6000.0)
    for r in runs:
        r["hosts"] = ["n0", "n1"] if r["backend"] == "horovod" else ["n0", "n0"]  # horovod 2x1, native 1x2
    (s,) = summarize(runs)
    assert [(c.backend, c.layout, c.best_name) for c in best_rows(s)] == [("native", "1x2", "default"),
                                                                          ("horovod", "2x1", "fusion 32 MiB")]
    assert best_ratios(best_rows(s), ("horovod", "native")) == []
    assert not any("best vs best" in v.text for v in job_verdicts(s))


def test_backends_on_different_nccl_networks_carry_a_caveat() -> None:
    """NCCL's network per rank (``nccl_transport``, from its INFO log): InfiniBand on one backend and TCP sockets on
    the other is a caveat of that layout's verdict; the same network, or no finding (CPU runs), is none."""
    ib = {"transport": "IB", "interfaces": ["mlx5_0:1"], "plugin": None, "inferred": False}
    sock = {"transport": "Socket", "interfaces": ["eth0"], "plugin": None, "inferred": False}
    runs = cell("native", 2, 100.0, nccl_transport=[ib, ib]) + cell("horovod", 2, 100.0, nccl_transport=[sock, sock])
    runs += cell("native", 1, 50.0, nccl_transport=[ib]) + cell("horovod", 1, 50.0, nccl_transport=[ib])
    (s,) = summarize(runs)
    one, two = job_verdicts(s)
    assert "NCCL" not in one.text
    assert "Caveats: NCCL used Socket (eth0) for horovod but IB (mlx5_0:1) for native: the two backends measured " \
           "different networks" in two.text, two.text
    (s,) = summarize(cell("native", 2, 100.0) + cell("horovod", 2, 100.0, nccl_transport=[sock, sock]))
    assert "NCCL" not in job_verdicts(s)[0].text  # no finding on one side: nothing to compare


def test_slower_with_more_workers_is_contention_and_a_collective_by_size_is_named() -> None:
    """Issue 48.5's report: both backends slower at 2 ranks than at 1 (native 0.51x, horovod 0.67x), Horovod's
    collective mpi at 1 rank and gloo at 2. The 2-rank verdict says it measures contention, not scaling, with each
    slowdown's interval; the ratio table's like-for-like cell names the collectives by size."""
    from common.report.document import ratio_table
    from common.report.verdict import like_for_like

    runs = cell("native", 1, 200.0, collective={"used": "ring"}) + cell("native", 2, 102.0, collective={"used": "ring"})
    runs += cell("horovod", 1, 200.0, collective={"used": "mpi"}) + cell("horovod", 2, 134.0,
                                                                          collective={"used": "gloo"})
    (s,) = summarize(runs)
    one, two = job_verdicts(s)
    assert "contention" not in one.text
    assert "Caveats: both backends slower with more workers (native 0.51x [" in two.text, two.text
    assert "] of 1 replica; horovod 0.67x [" in two.text
    assert "of 1 replica, its collective mpi at 1 replica, gloo at 2): at this size the comparison measures " \
           "contention, not scaling" in two.text
    assert [like_for_like(s, q) for q in s.ratios] == ["yes (horovod collective mpi at 1 replica, gloo at 2)"] * 2
    assert ratio_table(s).body[1][-1] == "yes (horovod collective mpi at 1 replica, gloo at 2)"
    # one backend only, and within noise none: no claim
    (s,) = summarize(cell("native", 1, 200.0) + cell("native", 2, 102.0) + cell("horovod", 1, 200.0)
                     + cell("horovod", 2, 390.0))
    assert "native slower with more workers (native 0.51x [" in job_verdicts(s)[1].text
    (s,) = summarize(cell("native", 1, 200.0) + cell("native", 2, 199.0) + cell("horovod", 1, 200.0)
                     + cell("horovod", 2, 390.0))
    assert "contention" not in job_verdicts(s)[1].text
    # fewer than 6 runs: only ranges that do not overlap say it
    (s,) = summarize(cell("native", 1, 200.0, n=3) + cell("native", 2, 150.0, n=3) + cell("horovod", 1, 200.0, n=3)
                     + cell("horovod", 2, 199.0, n=3))
    assert "native slower with more workers (native 0.75x (ranges apart) of 1 replica)" in job_verdicts(s)[1].text


def test_cpu_runs_say_the_ratio_does_not_carry_to_gpus_in_a_line_of_their_own() -> None:
    """Every run's devices a CPU: a line of its own after the layouts' (report.md and the printed lines); a GPU run
    in the job, or records without devices, make no such claim."""
    from common.report.document import verdict_section

    runs = cell("native", 2, 100.0, collective={"used": "ring"}) + cell("horovod", 2, 132.0,
                                                                         collective={"used": "gloo"})
    (s,) = summarize(runs)
    cpu = ("CPUs only (every run's devices: cpu; collectives native ring, horovod gloo): this says which backend was "
           "faster on this machine's cores; it does not carry to GPUs, where both backends all-reduce with NCCL by "
           "default")
    assert verdict_lines([s])[1] == f"  {cpu}"  # after the title, before the layouts' lines
    assert "horovod is 32% faster than native" in verdict_lines([s])[-1] and "CPUs" not in verdict_lines([s])[-1]
    bullets = next(b for b in verdict_section([s]).blocks if hasattr(b, "items"))
    assert bullets.items[0] == cpu
    gpu = runs[:-1] + [{**runs[-1], "devices": ["/physical_device:GPU:0"] * 2}]
    (s,) = summarize(gpu)
    assert not any("CPUs only" in x for x in verdict_lines([s]))
    (s,) = summarize([{**r, "devices": None} for r in runs])
    assert not any("CPUs only" in x for x in verdict_lines([s]))


def test_fit_input_wait_is_shown_as_an_upper_bound_or_said_not_measured() -> None:
    """Fit's input figure is the time between steps (input + Keras' host work): never called input-bound, shown as
    "input wait <= X% (upper bound, fit)" when not below the kept-up line; a fit row with no input figure says it was
    not measured; the custom loop's fetch keeps its input-bound words."""
    gap = {"method": "gap", "wait_fraction": 0.45, "kept_up": None, "input_bound": None}
    (s,) = summarize(cell("native", 2, 100.0, input=gap) + cell("horovod", 2, 100.2))
    (v,) = job_verdicts(s)
    assert v.text.endswith("Caveats: native input wait <= 45% (upper bound, fit)"), v.text
    (s,) = summarize(cell("native", 2, 100.0, input={"method": None, "reason": "r"}) + cell("horovod", 2, 100.2,
                                                                                            input=None))
    (v,) = job_verdicts(s)
    assert v.text.endswith("Caveats: input wait not measured (native and horovod, fit): whether the input kept up "
                           "is unknown"), v.text
    (s,) = summarize(cell("native", 2, 100.0) + cell("horovod", 2, 100.2))  # fit below 5%: kept up, no caveat
    assert "Caveats" not in job_verdicts(s)[0].text
    low = {**gap, "wait_fraction": 0.03}
    mixed = [{**r, "input": low} if i % 2 else r for i, r in enumerate(cell("native", 2, 100.0))]
    (s,) = summarize(mixed + cell("horovod", 2, 100.2))  # below 5% in every repeat, some undecided: no caveat
    assert s.rows[0].input.verdict is None and "Caveats" not in job_verdicts(s)[0].text
    ctl = Job(name="small", per_replica_batch_size=16, steps=12, mode="ctl")
    fetch = {"method": "fetch", "wait_fraction": 0.3, "kept_up": False, "input_bound": "highly"}
    (s,) = summarize(cell("native", 2, 100.0, job=ctl, input=fetch) + cell("horovod", 2, 100.2, job=ctl, input=None))
    (v,) = job_verdicts(s)
    assert v.text.endswith("Caveats: native highly input-bound"), v.text  # ctl without a figure: no fit claim


def test_the_demos_paired_rounds_give_the_verdict_from_three() -> None:
    """scripts/demo.sh's rounds (its files end -r<k>; both backends on this machine's hosts): paired from 3 rounds,
    the t interval's centre (the geometric mean of the round ratios) as the lead, the design named."""
    from common.core.results import RunRecord
    from common.report.load import LoadedRun

    drift = [1.0, 0.8, 1.1]  # the machine's load in each round, shared by its pair
    runs = [LoadedRun(RunRecord.from_dict(make_run(b, 2, base * f * (1 + 0.002 * k), run_id=f"{b}-{k}",
                                                   hosts=["box"] * 2, input=KEPT_UP)), f"/d/{b}-{k}-r{k}.json")
            for k, f in enumerate(drift, 1) for b, base in (("native", 112.0), ("horovod", 100.0))]
    (s,) = summarize(runs)
    (v,) = job_verdicts(s)
    assert v.text.startswith("1 node x 2 ranks: native is 12% faster than horovod ["), v.text
    assert v.text.endswith("(3 rounds, paired: every round on the same nodes, t interval of the per-round ratios)")
