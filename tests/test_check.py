"""``python -m common.check``: the pair-by-pair comparison on synthetic records (no TensorFlow: agreeing and
diverging runs), its answer to each question (same math, scales exactly, fit = custom loop) with what may cause a
difference, the whole command (``main``) against fakes of its runs (what it prints, what it leaves out and why, its
exit status, check.json), bad input (exit 2 before any run), and one real call (the Dropout example's 4 runs, from a
folder outside the checkout with relative paths, then a backend run and the report there). The real check of the
example job on every backend, mode and world size, and of a rank-dependent model (exit 6), is in
tests/test_usercode_parity.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from common import check
from common.check import RunKey
from common.report.migrate import MODES, NO, NOT_COMPARED, SAME_MATH, SCALES, YES, Answer
from tests.conftest import PY, REPO, SMOKE, base_env

LOSSES = [2.3, 1.7, 1.2, 0.9, 0.8, 0.7]
FINGER = [[-3.5, 40.0], [0.25, 0.5]]
EVALS = [{"epoch": 0.5, "step": 6, "loss": 1.1, "accuracy": 0.6, "seconds": 0.1, "wall_time": 2.0}]


def record(losses=LOSSES, finger=FINGER, evals=EVALS, **extra) -> dict:
    return {"step_losses": list(losses), "trainable_weights_fingerprint": finger, "evaluations": evals, **extra}


def all_runs(kinds=("native", "horovod"), modes=("fit", "ctl")) -> dict[RunKey, dict]:
    return {RunKey(k, m, w): record() for m in modes for w in (1, 2) for k in kinds}


def test_pairs_cover_backends_world_sizes_and_modes():
    labels = [p[0] for p in check.pairs(list(all_runs()))]
    assert len(labels) == 12
    assert "native vs horovod, ctl, 2 workers" in labels
    assert "horovod fit: 1 worker x 2b vs 2 workers x b" in labels
    assert "native 1 worker: fit vs ctl" in labels
    only_ctl = [p[0] for p in check.pairs(list(all_runs(modes=("ctl",))))]
    assert only_ctl == ["native vs horovod, ctl, 1 worker", "native vs horovod, ctl, 2 workers",
                        "native ctl: 1 worker x 2b vs 2 workers x b", "horovod ctl: 1 worker x 2b vs 2 workers x b"]


def test_agreeing_runs_exit_0_within_the_tolerance():
    runs = all_runs()
    # a float32 reduction in another order: 1 worker vs 2 workers differ by ~1e-7, within 1e-5
    runs[RunKey("native", "fit", 1)] = record([x * (1 + 3e-7) for x in LOSSES])
    rows = check.compare(runs)
    assert all(r.ok for r in rows)
    assert max(r.max_rel for r in rows) == pytest.approx(3e-7, rel=1e-3)
    status, line = check.verdict(rows)
    assert status == 0 and "all 12 pairs agree" in line
    table = check.format_table(rows)
    assert "max rel loss diff" in table and "native fit: 1 worker x 2b vs 2 workers x b" in table


def test_a_rank_dependent_run_exits_1_naming_the_pair_step_and_values():
    runs = all_runs(modes=("ctl",))
    bad = list(LOSSES)
    bad[3] = 0.95  # e.g. a per-rank seed: the 2-worker run drifts from step 4 on
    runs[RunKey("horovod", "ctl", 2)] = record(bad)
    rows = check.compare(runs)
    status, line = check.verdict(rows)
    assert status == 1
    assert line == ("DIFFERS: native vs horovod, ctl, 2 workers: loss differs, step 4: 0.9 vs 0.95 "
                    f"(tolerance {check.RTOL:g})")
    assert "DIFFERS" in check.format_table(rows)
    assert [r.ok for r in rows] == [True, False, True, False]


def test_final_weights_and_validation_are_compared_too():
    runs = all_runs(modes=("ctl",))
    runs[RunKey("native", "ctl", 2)] = record(finger=[[-3.5, 40.0], [0.25, 0.5001]])
    status, line = check.verdict(check.compare(runs))
    assert status == 1 and "final weights differs, variable 1 sum of squares 0.5001 vs 0.5" in line
    runs = all_runs(modes=("ctl",))
    runs[RunKey("horovod", "ctl", 1)] = record(evals=[{**EVALS[0], "accuracy": 0.65, "wall_time": 9.0}])
    status, line = check.verdict(check.compare(runs))
    assert status == 1 and "validation differs, step 6 accuracy: 0.6 vs 0.65" in line
    # times are not compared; a sum near 0 is compared against the variable's norm, not itself
    runs = {k: record(finger=[[-3.5, 40.0], [1e-9, 0.5]]) for k in all_runs(modes=("ctl",))}
    runs[RunKey("horovod", "ctl", 1)] = record(finger=[[-3.5, 40.0], [1e-9, 0.5]],
                                               evals=[{**EVALS[0], "wall_time": 9.0, "seconds": 3.0}])
    runs[RunKey("native", "ctl", 1)] = record(finger=[[-3.5, 40.0], [-1e-9, 0.5]])
    assert check.verdict(check.compare(runs))[0] == 0
    # records without fingerprints or evaluations (older runs): n/a, not a difference
    assert check.compare_weights(None, FINGER) == (None, None)
    assert check.compare_evaluations([], None) == (None, None)
    assert check.compare_losses(LOSSES, LOSSES[:-1]) == (None, "6 vs 5 steps")


def dropout_like() -> dict[RunKey, dict]:
    """ctl runs where 1 worker x 2b differs from 2 workers x b from step 1 on both backends alike (as Dropout's
    masks drawn per replica make them), and native = horovod bit for bit at each size."""
    runs = all_runs(modes=("ctl",))
    for k in ("native", "horovod"):
        runs[RunKey(k, "ctl", 2)] = record([2.4, *LOSSES[1:]], finger=[[-3.4, 41.0], [0.25, 0.5]])
    return runs


DROPOUT = check.ModelTerms("droppkg/model.py's build", ("Dropout",))


def test_a_job_that_does_not_scale_exactly_is_not_a_backend_difference():
    """Same math is native vs horovod; 1 worker x 2b vs 2 workers x b is its own answer (exit 6), its numbers said
    once for both backends, its cause the Dropout the model's source shows."""
    runs = dropout_like()
    rows = check.compare(runs)
    status, line = check.verdict(rows)
    assert status == check.EXIT_SCALES_INEXACTLY == 6
    assert line == ("SCALES INEXACTLY (exit 6): the backends agree (same math), but native ctl: 1 worker x 2b vs 2 "
                    "workers x b: loss differs, step 1: 2.3 vs 2.4 (tolerance 1e-05)")
    said = check.answers(rows, runs, check.why_not_compared(runs), DROPOUT)
    assert said[SAME_MATH] == Answer(YES, "2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and 2 "
                                          "workers)")
    scales = said[SCALES]
    assert (scales.answer, scales.likely) == (NO, True)
    assert scales.text == ("native ctl: 1 worker x 2b vs 2 workers x b: loss differs, step 1: 2.3 vs 2.4 (the same "
                           "numbers on horovod: the job's own math, not a backend's)")
    (cause,) = scales.causes
    assert cause.startswith("per-replica random draws: droppkg/model.py's build uses Dropout: each replica draws")
    assert said[MODES] == Answer(NOT_COMPARED, "one mode checked (ctl: --modes)")
    # the model's source unread: possible causes, the rank among them
    unread = check.answers(rows, runs, {}, check.ModelTerms())[SCALES]
    assert not unread.likely and unread.causes == (
        "a random draw or batch statistic per replica (the model's source could not be read), or a computation that "
        "depends on the rank",)
    # a backend difference says more: exit 1 even with the scaling pair differing too
    runs[RunKey("horovod", "ctl", 2)] = record([2.5, *LOSSES[1:]])
    status, line = check.verdict(check.compare(runs))
    assert status == 1 and line.startswith("DIFFERS: native vs horovod, ctl, 2 workers: loss differs, step 1: 2.4 vs")


def test_a_small_late_difference_is_put_down_to_the_reduction_order_and_the_threads():
    runs = all_runs(modes=("ctl",))
    late = [*LOSSES[:4], 0.8 * (1 + 3e-5), 0.7 * (1 + 8e-5)]
    for k in ("native", "horovod"):
        runs[RunKey(k, "ctl", 1)] = record(backend_info={"threads_per_process": 2})
        runs[RunKey(k, "ctl", 2)] = record(late, backend_info={"threads_per_process": 1})
    rows = check.compare(runs)
    assert check.verdict(rows)[0] == check.EXIT_SCALES_INEXACTLY
    scales = check.answers(rows, runs, {}, check.ModelTerms("twinbench's mlp"))[SCALES]
    assert scales.likely and [c.split(":")[0] for c in scales.causes] == [
        "reduction order", "threads per rank differ (2 at 1 worker, 1 at 2 workers)"]
    assert "step 5: " in scales.text
    # the losses within 1e-5 (1e-7 apart), the final weights not: the rounding of a few steps, as likely
    for k in ("native", "horovod"):
        runs[RunKey(k, "ctl", 2)] = record([x * (1 + 1e-7) for x in LOSSES], finger=[[-3.5, 40.0], [0.2501, 0.5]],
                                           backend_info={"threads_per_process": 1})
    scales = check.answers(check.compare(runs), runs, {}, check.ModelTerms("twinbench's mlp"))[SCALES]
    assert scales.likely and scales.text.startswith("native ctl: 1 worker x 2b vs 2 workers x b: final weights differs")
    late[-1] = 0.9  # large: not only rounding; what the source does not show is possible too
    for k in ("native", "horovod"):
        runs[RunKey(k, "ctl", 2)] = record(late, backend_info={"threads_per_process": 1})
    rows = check.compare(runs)
    scales = check.answers(rows, runs, {}, check.ModelTerms("twinbench's mlp"))[SCALES]
    assert not scales.likely and scales.causes[-1].startswith(
        "a random draw or batch statistic per replica (twinbench's mlp's source shows none)")


def test_fit_vs_ctl_is_its_own_answer_and_exit_status():
    runs = all_runs()
    for k in ("native", "horovod"):
        for w in (1, 2):
            runs[RunKey(k, "fit", w)] = record([2.31, *LOSSES[1:]])
    rows = check.compare(runs)
    status, line = check.verdict(rows)
    assert status == check.EXIT_MODES_DIFFER == 7
    assert line.startswith("FIT DIFFERS FROM CTL (exit 7): the backends agree (same math) and the job scales "
                           "exactly, but native 1 worker: fit vs ctl: loss differs, step 1: 2.31 vs 2.3")
    said = check.answers(rows, runs, {}, DROPOUT)
    assert [said[q].answer for q in (SAME_MATH, SCALES, MODES)] == [YES, YES, NO]
    assert said[MODES].causes[0].startswith("random draws in another order: droppkg/model.py's build uses Dropout")
    assert said[SCALES].text == "4 pairs agree to 1e-05, bit for bit (native, horovod in fit and ctl)"


def test_the_exit_statuses_are_the_reports_and_no_other_commands():
    from common.core import errors
    from common.report import migrate

    statuses = {0, check.EXIT_DIFFERS, check.EXIT_UNSHARDED, check.EXIT_SCALES_INEXACTLY, check.EXIT_MODES_DIFFER}
    assert set(migrate.STATUS) == statuses and len(statuses) == 5
    assert not statuses & {errors.EXIT_USAGE, errors.EXIT_PEER_LOST, errors.EXIT_PREEMPTED}
    assert Answer(NO, "x", ("a",), True).words() == "no: x; likely cause: a"
    assert Answer(NO, "x", ("a", "b")).words() == "no: x; possible causes: (1) a; (2) b"


def test_the_models_source_is_read_for_random_layers_and_batch_statistics(tmp_path, restore_sys_path):
    """Without importing it: the user's function and the module-level helpers it names (not a docstring, not a
    function it never calls), twinbench's builtins, Keras' applications."""
    from common.workload.job import Job, load_job

    assert check.model_terms(load_job(REPO / "examples" / "dropout_job.toml")) == DROPOUT
    assert check.model_terms(load_job(REPO / "examples" / "my_job.toml")) == check.ModelTerms("mypkg/model.py's build")
    assert check.model_terms(Job(model="resnet20")).batch == ("BatchNormalization",)
    assert check.model_terms(Job(model="mlp")) == check.ModelTerms("twinbench's mlp")
    assert check.model_terms(Job(model="ResNet50")) == check.ModelTerms("tf_keras's ResNet50", (),
                                                                         ("BatchNormalization",))
    (tmp_path / "noisy").mkdir()
    (tmp_path / "noisy" / "__init__.py").write_text("")
    (tmp_path / "noisy" / "net.py").write_text('''"""No Dropout here, says the docstring."""
import tensorflow as tf


def _noise(x):
    return x + tf.random.normal(tf.shape(x))


def unused():
    return tf.keras.layers.BatchNormalization()


def build(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(_noise(inputs)))
''')
    job = tmp_path / "job.toml"
    job.write_text('pythonpath = ["."]\nmodel = "noisy.net:build"\n')
    assert check.model_terms(load_job(job)) == check.ModelTerms("noisy/net.py's build", ("tf.random.normal",))
    (tmp_path / "noisy" / "ranked.py").write_text('''import os
import horovod.tensorflow as hvd


def build(input_shape, num_classes):
    return int(os.environ.get("HOROVOD_RANK", "0")) + hvd.local_rank()
''')
    job.write_text('pythonpath = ["."]\nmodel = "noisy.ranked:build"\n')
    terms = check.model_terms(load_job(job))
    assert terms.rank == ("HOROVOD_RANK", "hvd.local_rank()") and not terms.random
    runs = dropout_like()
    (cause,) = check.answers(check.compare(runs), runs, {}, terms)[SCALES].causes
    assert cause == ("the model reads the rank: noisy/ranked.py's build uses HOROVOD_RANK, hvd.local_rank(): each "
                     "replica computes something else, where 1 worker is rank 0 alone")


def _check(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "common.check", *args], cwd=REPO, env=base_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--job", "nope.toml"], "job file 'nope.toml' not found"),
    (["--job", SMOKE, "--set", "optimiser=sgd"], "unknown job key"),
    (["--job", SMOKE, "--modes", "fit,eager"], "--modes 'fit,eager'"),
    (["--job", SMOKE, "--steps", "0"], "--steps must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_run(args, message):
    proc = _check(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_check_imports_no_tensorflow():
    code = "import sys, common.check\nprint('tensorflow' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-500:]


def test_text_table_aligns_columns_and_strips_trailing_spaces():
    from common.core.text import text_table

    rows = [("pair", "steps", "ok"), ("native vs horovod", "6", "agree")]
    assert text_table(rows, rule=True) == ["pair               steps  ok", "-----------------  -----  -----",
                                           "native vs horovod  6      agree"]
    assert text_table(rows, right=True, indent="  ")[1] == "  native vs horovod      6  agree"


def _plan(*sets: str) -> check.Plan:
    return check.make_plan(check.parser().parse_args(["--job", SMOKE, *(a for s in sets for a in ("--set", s))]))


def test_linear_lr_scaling_gives_the_one_worker_runs_the_two_worker_lr(tmp_path, monkeypatch):
    """lr_scaling = "linear" gives 2 workers 2 x learning_rate: the 1 worker x 2b runs are told to scale the recipe's
    LR for 2 replicas (a runtime flag, not a --set: the job and its hash stay the user's), or the pair compares two
    LRs; with lr_scaling = "none" nothing is added. The command is read, not run."""
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "stop")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    plan = _plan("lr_scaling=linear", "learning_rate=0.1")
    assert plan.one_worker_lr == 0.2 and not plan.world_size_note
    for workers in (1, 2):
        check.run_one(plan, RunKey("native", "ctl", workers), tmp_path, 10)
    one, two = seen
    assert one[one.index(check.LR_REPLICAS_FLAG) + 1] == "2" and check.LR_REPLICAS_FLAG not in two
    assert check.LR_REPLICAS_FLAG == "--lr-replicas"  # the flag every backend's entry takes (common/cli.py)
    assert [a for a in one if a.startswith("learning_rate=")] == ["learning_rate=0.1"]  # the user's --set only
    assert "per_replica_batch_size=" in " ".join(one)
    assert _plan("lr_scaling=none").one_worker_lr is None


def test_relative_paths_mean_the_users_working_directory(tmp_path, monkeypatch):
    """--job and --results as typed in another folder: the runs are told absolute paths and start in that folder
    (not the checkout), so the results land where the user said and the job's relative paths mean what they mean to
    the user's own backend runs."""
    seen = []

    def fake_run(cmd, **kw):
        seen.append((cmd, kw["cwd"]))
        return subprocess.CompletedProcess(cmd, 1, "", "stop")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    work = tmp_path / "work"
    (work / "jobs").mkdir(parents=True)
    (work / "jobs" / "j.toml").write_text((REPO / "jobs" / "smoke.toml").read_text())
    monkeypatch.chdir(work)
    plan = check.make_plan(check.parser().parse_args(["--job", "jobs/j.toml", "--results", "da"]))
    assert (plan.job, plan.results, plan.cwd) == (str(work / "jobs" / "j.toml"), work / "da", str(work))
    check.run_one(plan, RunKey("native", "ctl", 2), plan.results / "native-ctl-n2", 10)
    ((cmd, cwd),) = seen
    assert cwd == str(work) != str(REPO)
    assert cmd[cmd.index("--job") + 1] == str(work / "jobs" / "j.toml")
    assert cmd[cmd.index("--results") + 1] == str(work / "da" / "native-ctl-n2")


def test_a_warmup_compares_one_worker_to_two_at_the_warmup_of_two():
    """Horovod's warm-up rule ramps from LR / replicas: the 1 worker x 2b runs get --lr-replicas 2 (the recipe's
    warm-up follows it, common/training/objective.py), so the pair is compared, not left out; with neither a warm-up
    nor linear scaling nothing is added."""
    plan = _plan("warmup_epochs=1")
    assert plan.one_worker_lr is not None and not plan.world_size_note
    assert _plan("warmup_epochs=0", "lr_scaling=none").one_worker_lr is None


# -- the whole command against fakes of its runs (no TensorFlow, no process) ----------------------------------------
def fake_runs(monkeypatch, make=lambda key: record()) -> list[RunKey]:
    """check.run_one replaced: each run's record is ``make(key)`` (None: the run failed); returns the keys run."""
    ran = []

    def run_one(plan, key, out, timeout):
        ran.append(key)
        rec = make(key)
        return (rec, "") if rec is not None else (None, f"{key.text()} failed (exit 1): cmd\nTraceback: boom")

    monkeypatch.setattr(check, "run_one", run_one)
    return ran


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = check.main(["--job", SMOKE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def piped(*prints: str) -> dict:
    """A record of an input function's run: each rank's fingerprint of its first batches."""
    return record(input={"pipeline": {"per_rank": [{"fingerprint": f} for f in prints]}})


def test_main_runs_every_configuration_once_and_agrees(monkeypatch, capsys):
    ran = fake_runs(monkeypatch)
    code, out, err = _main(capsys)
    assert code == 0 and err == ""
    assert len(ran) == len(set(ran)) == 8 and out.count("[check] run ") == 8
    assert out.strip().splitlines()[-1] == "all 12 pairs agree to 1e-05" and "not compared" not in out


def test_a_kept_check_writes_the_verdict_the_reports_leave_horovod_section_reads(monkeypatch, capsys, tmp_path):
    """--results DIR: DIR/check.json holds the user's job (their --set, not the check's steps) and the verdict, and
    the report finds it one level below a results directory, as the same math of that job."""
    from common.report import migrate
    from common.workload.job import load_job

    fake_runs(monkeypatch, lambda k: record(losses=[1.0, 0.5 + (k.backend == "horovod") * 0.1]))
    code, _, _ = _main(capsys, "--set", "seed=7", "--results", str(tmp_path / "check"))
    assert code == 1
    (found,) = migrate.load_checks([tmp_path])
    job = load_job(SMOKE, ["seed=7"])
    assert (found.job_hash, found.status) == (job.job_hash, 1) and found.job["seed"] == 7
    assert found.job["steps"] == job.steps  # the job's own steps, not the check's
    assert "differ" in found.line


def test_the_last_lines_and_check_json_give_each_answer(monkeypatch, capsys, tmp_path):
    """A job that does not scale exactly: exit 6, a line per question (what the report's rows say) and then the
    verdict end the output; check.json holds the same answers, which the report reads back."""
    from common.report import migrate

    runs = dropout_like()
    fake_runs(monkeypatch, lambda k: runs.get(k))
    code, out, err = _main(capsys, "--modes", "ctl", "--results", str(tmp_path / "check"))
    assert code == check.EXIT_SCALES_INEXACTLY
    last = out.strip().splitlines()[-3:]
    assert [ln.split(": ")[0] for ln in last] == ["[check] same math", "[check] scales exactly",
                                                  "[check] fit = custom loop"]
    assert last[1].startswith("[check] scales exactly: 1 worker x 2b = 2 workers x b: no: native ctl: 1 worker x 2b")
    assert err.strip().splitlines()[-1].startswith("SCALES INEXACTLY (exit 6): the backends agree (same math)")
    (found,) = migrate.load_checks([tmp_path])
    assert found.status == 6 and found.line == err.strip().splitlines()[-1]
    assert [f"[check] {migrate.QUESTIONS[q]}: {found.answer(q).words()}" for q in migrate.QUESTIONS] == last


def test_main_names_every_pair_it_leaves_out_and_why(monkeypatch, capsys):
    """An input function (fingerprints in the records): 1 worker vs 2 workers is left out per backend, each named."""
    fake_runs(monkeypatch, lambda k: piped("x") if k.workers == 1 else piped("a", "b"))
    code, out, _ = _main(capsys, "--modes", "ctl")
    skipped = [ln for ln in out.splitlines() if ln.startswith("[check] not compared")]
    assert skipped == [f"[check] not compared: {b} ctl, 1 worker vs 2 workers: an input function shards its own "
                       "data, so 2 workers read other batches than 1" for b in ("native", "horovod")]
    assert code == 0 and out.strip().splitlines()[-1] == "all 2 pairs agree to 1e-05; 2 not compared (listed above)"
    fake_runs(monkeypatch)
    code, out, _ = _main(capsys, "--modes", "fit", "--set", "warmup_epochs=1")
    assert code == 0 and "[check] not compared" not in out
    assert "scales exactly: 1 worker x 2b = 2 workers x b: yes" in out


def test_an_unsharded_input_function_is_not_a_clean_pass(monkeypatch, capsys):
    """Every rank of the 2-worker runs got the same first batches: the pairs agree, the exit status is its own."""
    fake_runs(monkeypatch, lambda k: piped("x") if k.workers == 1 else piped("a", "a"))
    code, out, err = _main(capsys, "--modes", "ctl")
    assert code == check.EXIT_UNSHARDED == 5
    assert out.count("every rank got the same first batches: does the input function shard") == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("NOT CLEAN (exit 5): every rank got the same first batches in native ctl 2 workers, "
                           "horovod ctl 2 workers: the input function does not shard"), line
    # a difference says more than the missing sharding: exit 1 names it
    fake_runs(monkeypatch, lambda k: piped("a", "a") if k != RunKey("horovod", "ctl", 2) else piped("b", "b"))
    code, _, err = _main(capsys, "--modes", "ctl")
    assert code == 1 and "saw different data" in err


def test_a_horovod_launch_the_build_cannot_run_is_one_line_before_any_run(monkeypatch, capsys):
    from backends import horovod_launch

    ran = fake_runs(monkeypatch)
    monkeypatch.setattr(horovod_launch, "built", lambda probe: {"gloo": False, "mpi": True})  # conda-forge's build
    monkeypatch.setenv(horovod_launch.ENV, "gloo")
    with pytest.raises(SystemExit) as e:
        check.main(["--job", SMOKE])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and ran == [] and out == ""
    assert err.strip().splitlines() == [
        "common.check: error: TWINBENCH_HOROVOD_CONTROLLER=gloo: this Horovod was built without Gloo (MPI only): use "
        "TWINBENCH_HOROVOD_CONTROLLER=mpi or auto"]
    monkeypatch.delenv(horovod_launch.ENV)  # auto: the MPI launch, said once before the runs, exported to them
    seen = []
    monkeypatch.setattr(check, "run_one", lambda plan, key, out, timeout: (
        seen.append(os.environ.get(horovod_launch.ENV)) or record(), ""))
    assert check.main(["--job", SMOKE, "--modes", "ctl"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        "[check] horovod ranks: mpirun (MPI controller; auto: this Horovod has MPI only)"
    assert seen == ["mpi"] * 4 and horovod_launch.ENV not in os.environ


def test_a_failed_run_stops_the_check_with_its_tail(monkeypatch, capsys):
    ran = fake_runs(monkeypatch, lambda k: None if k == RunKey("horovod", "fit", 2) else record())
    with pytest.raises(SystemExit) as e:
        check.main(["--job", SMOKE])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and ran[-1] == RunKey("horovod", "fit", 2) and len(ran) == 4
    assert "FAILED" in out and "horovod fit 2 workers failed (exit 1)" in err and "Traceback: boom" in err


@pytest.mark.distributed
def test_a_dropout_job_checked_and_reported_from_outside_the_checkout(tmp_path):
    """The real call, two proofs from one check. examples/dropout_job.toml (Dropout: each replica draws its own
    masks), copied to a folder outside the checkout and checked from there with relative --job and --results:
    native = horovod bit for bit at 1 and 2 workers (same math: yes), 1 worker x 2b vs 2 workers x b differs from
    step 1 on both alike, put down to the Dropout in its source, exit 6; the runs land in that folder's da/, not
    the checkout's. Then a backend run and the report from the same folder with relative paths: its leave-Horovod
    table says same math yes and explains the scaling row."""
    work = tmp_path / "work"
    for name in ("droppkg", "mypkg"):
        shutil.copytree(REPO / "examples" / name, work / "jobs" / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "examples" / "dropout_job.toml", work / "jobs" / "dropout_job.toml")

    def here(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", *args], cwd=work, env=base_env(), capture_output=True, text=True,
                              timeout=timeout)

    proc = here("common.check", "--job", "jobs/dropout_job.toml", "--modes", "ctl", "--steps", "4", "--results",
                "da", timeout=900)
    assert proc.returncode == check.EXIT_SCALES_INEXACTLY, proc.stdout + proc.stderr[-3000:]
    same, scales, modes = proc.stdout.strip().splitlines()[-3:]
    assert same == ("[check] same math: yes: 2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and 2 "
                    "workers)")
    assert scales.startswith("[check] scales exactly: 1 worker x 2b = 2 workers x b: no: native ctl: 1 worker x 2b "
                             "vs 2 workers x b: loss differs, step 1: "), scales
    assert ("(the same numbers on horovod: the job's own math, not a backend's); likely cause: per-replica random "
            "draws: droppkg/model.py's build uses Dropout") in scales
    assert modes == "[check] fit = custom loop: not compared: one mode checked (ctl: --modes)"
    assert sorted(p.name for p in (work / "da").iterdir()) == ["check.json", "horovod-ctl-n1", "horovod-ctl-n2",
                                                                "native-ctl-n1", "native-ctl-n2"]
    assert not (REPO / "da").exists()
    run = here("backends.native", "--job", "jobs/dropout_job.toml", "--set", "steps=4", "--results", "runs",
               "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list((work / "runs").glob("*.json"))) == 1
    # "." finds da/check.json and runs/; the check's 2-worker runs (the same job: b, 4 steps) are named to be read
    rep = here("common.report", ".", "da/native-ctl-n2", "da/horovod-ctl-n2", "--out", "rep", "--no-plots", timeout=120)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    md = (work / "rep" / "report.md").read_text()
    part = md[md.index("## Can this job leave horovod"):]
    assert ("| same math |  |  | yes: 2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and 2 "
            "workers) (common.check of this job with other steps, ") in part
    assert "| scales exactly: 1 worker x 2b = 2 workers x b |  |  | no: native ctl: 1 worker x 2b vs 2 workers x b: " \
           "loss differs, step 1: " in part and "likely cause: per-replica random draws: droppkg/model.py's" in part


def test_data_the_users_function_gives_that_twinbench_refuses_is_one_line_before_any_run(monkeypatch, capsys):
    """A dataset function's pipeline twinbench cannot read exactly (tfdata refuses it as the user's code's error, read
    while the check plans) is one line and exit 2, not a traceback."""
    from common.workload import data as data_mod
    from common.workload.usercode import UserCodeError

    ran = fake_runs(monkeypatch)

    def refuse(job):
        raise UserCodeError("dataset = 'pk.d:load': the training tf.data.Dataset is sharded (shard(2, 1) under map())")

    monkeypatch.setattr(data_mod, "dataset_info", refuse)
    with pytest.raises(SystemExit) as e:
        check.main(["--job", SMOKE])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and ran == [] and out == ""
    assert err.strip().splitlines() == ["common.check: error: dataset = 'pk.d:load': the training tf.data.Dataset is "
                                        "sharded (shard(2, 1) under map())"]
