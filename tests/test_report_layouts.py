"""The report says, per backend and world size run in several layouts, whether the layouts computed the same losses,
from which step they differ and whether their ranks' thread counts differ (the usual cause). Fast, no TensorFlow."""

from __future__ import annotations

from typing import Any

from common.report.summary import summarize
from tests.test_report import make_run

LOSSES = [2.3069757, 2.2, 2.1, 2.0, 1.9, 1.8, 0.0465]


def run(backend: str, hosts: list[str], threads: int, losses: list[float]) -> dict[str, Any]:
    return make_run(backend, 2, 100.0, run_id=f"{backend}-{'-'.join(hosts)}", hosts=hosts, step_losses=losses,
                    backend_info={"strategy": backend, "threads_per_process": threads})


def test_layouts_of_one_size_say_whether_they_computed_the_same_losses() -> None:
    other = LOSSES[:5] + [1.8000001, 0.0570]  # one float32 rounding at step 5, then 200 steps apart
    (s,) = summarize([run("native", ["n0", "n0"], 1, LOSSES), run("native", ["n0", "n1"], 2, other),
                      run("horovod", ["n0", "n0"], 1, LOSSES), run("horovod", ["n0", "n1"], 1, LOSSES)])
    notes = [n for n in s.notes if "layouts" in n]
    assert notes == [
        "horovod at 2 replicas: layouts 1x2 and 2x1 computed the same losses, bit for bit (7 steps)",
        "native at 2 replicas: layouts 1x2 and 2x1 computed different losses from step 5 (1.8 vs 1.8000001; final "
        "0.0465 vs 0.057); their ranks ran 1 and 2 intra-op threads (from the cores per rank on a host): a sum split "
        "over another number of threads rounds differently, and `--threads N` on both computes the same math "
        "(docs/parity.md)"], notes
    (s,) = summarize([run("native", ["n0", "n0"], 2, LOSSES), run("native", ["n0", "n1"], 2, other)])
    assert [n for n in s.notes if "layouts" in n][0].endswith(
        "with the same thread count the cause is elsewhere (an op's placement or algorithm per layout)")
    (s,) = summarize([run("native", ["n0", "n0"], 1, LOSSES)])  # one layout: nothing to say
    assert not [n for n in s.notes if "layouts" in n]
