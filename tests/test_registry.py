"""The backend registry is complete and cheap: every entry keeps the contract, nothing heavy is imported to list it."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

from common.core import registry
from common.core.contract import Backend, BackendSpec, BaseOptions, Capabilities, Collective, Diagnosis, Knob, RankInfo
from common.report.load import load_runs
from common.report.render import format_table
from common.report.summary import summarize
from tests.conftest import REPO, base_env


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_backend_keeps_the_contract(name):
    entry = registry.entry(name)
    mod = registry.load(name)
    classes = [c for c in vars(mod).values() if inspect.isclass(c) and issubclass(c, Backend) and c is not Backend]
    assert [c.name for c in classes] == [name], f"{entry.module} must define one Backend subclass named {name!r}"
    assert not inspect.isabstract(classes[0]), f"{classes[0].__name__} leaves abstract members unimplemented"
    assert isinstance(mod, BackendSpec), f"{entry.module} lacks a module-level member of contract.BackendSpec"
    assert issubclass(mod.Options, BaseOptions) and mod.Options.__dataclass_params__.frozen
    args = mod.parser().parse_args([])
    assert isinstance(mod.Options.from_args(args), mod.Options)
    # one place for the defaults: no flag given gives the Options dataclass's defaults
    assert mod.Options.from_args(args) == mod.Options()
    assert (REPO / entry.slurm_script).is_file()
    without_tf = mod.doctor(None)  # what the doctor says when TensorFlow does not import
    assert isinstance(without_tf, Diagnosis) and not without_tf.ok and without_tf.status.startswith("cannot run")
    one = mod.local_command(1, ["--job", "x.toml"], python="/py")
    assert one[:3] == ["/py", "-m", entry.module] and one[-2:] == ["--job", "x.toml"]
    two = mod.local_command(2, ["--job", "x.toml"], python="/py")
    assert two != one and "2" in two and two[-2:] == ["--job", "x.toml"]


def test_the_contract_fits_on_a_screen():
    """What a backend author reads: the abstract members, then about a dozen with a default (Lifecycle's five hooks
    among them) and the RankInfo shortcuts; nothing that only one backend means."""
    abstract = sorted(Backend.__abstractmethods__)
    assert abstract == ["_connect", "allgather", "allreduce_fn", "allsum", "capabilities", "make_dataset",
                        "reduce_gradients", "run_step"]
    public = {n for n in dir(Backend) if not n.startswith("_")}
    shortcuts = {"info", "rank", "num_workers", "num_replicas", "is_chief", "name", "setup"}
    groups = [{"capabilities"}, {"describe"}, {"scope"}, {"make_dataset"},
              {"run_step", "reduce_gradients"}, {"fit_callbacks"}, {"train_loop"},
              {"allsum", "allgather", "allreduce_fn", "barrier"}, {"start_timeline", "stop_timeline"},
              {"before_training", "sync_model_state", "restore", "exit_barrier", "shutdown"}]
    assert public - shortcuts == set().union(*groups) and len(groups) + 1 == 11  # + setup
    assert not public & {"wrap_tape", "phases", "wrap_optimizer",  # the one reduction replaced them
                         "uses_coordinator", "variant", "profiler_caveat", "input_path", "gradient_bytes", "knobs",
                         "collective", "writes_checkpoint", "breakdown_problem", "fit_warmup"}


def test_capabilities_record_and_gradient_bytes():
    knob = Knob("fusion_threshold_bytes", 1, 2, "fusion 1 B")
    caps = Capabilities(Collective("auto", "gloo", "why"), controller="gloo", compression="fp16", knobs=(knob,))
    assert caps.gradient_bytes(10) == 20 and Capabilities(caps.collective).gradient_bytes(10) == 40
    assert caps.record() == {"controller": "gloo", "compression": "fp16", "input_path": "per-worker",
                             "variant": None, "asynchronous": False, "every_rank_writes_checkpoint": True,
                             "optimizer_reduces": False}
    with pytest.raises(ValueError, match="compression 'int8'"):
        Capabilities(caps.collective, compression="int8")


def test_a_backend_without_the_gradient_reduction_cannot_be_constructed():
    """A backend that does not say how it reduces gradients would train one independent model per rank: it fails
    at construction instead, with one line naming the missing method."""
    from tests import toy_backend

    everything_else = {k: v for k, v in vars(toy_backend.ToyBackend).items() if k != "reduce_gradients"}
    Forgetful = type("Forgetful", (Backend,), everything_else)
    with pytest.raises(TypeError, match="abstract method.*reduce_gradients") as err:
        Forgetful()
    assert len(str(err.value).splitlines()) == 1
    assert toy_backend.ToyBackend().reduce_gradients([1.0]) == [1.0]  # the toy backend says it: one replica


def test_the_toy_backend_keeps_the_module_contract():
    from tests import toy_backend

    assert isinstance(toy_backend, BackendSpec)
    assert toy_backend.Options.from_args(toy_backend.parser().parse_args([])) == toy_backend.Options()


def test_rank_info_is_frozen_and_derives_replicas():
    info = RankInfo(rank=1, num_workers=2, local_rank=1, local_size=2, replicas_per_worker=3, device="cpu", threads=1)
    assert info.num_replicas == 6 and not info.is_chief
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rank = 0  # type: ignore[misc]


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'nope': use one of native, horovod"):
        registry.load("nope")


def test_listing_backends_imports_no_backend_and_no_tensorflow():
    code = ("import sys; from common.core import registry; registry.names(); "
            "print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'horovod', 'backends.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_shell_helper_prints_each_backends_local_command():
    run = lambda *a: subprocess.run([sys.executable, "-m", "backends", *a], cwd=REPO, env=base_env(),  # noqa: E731
                                    capture_output=True, text=True)
    assert run("names").stdout.split() == list(registry.names())
    for name in registry.names():
        out = run("command", name, "2", "--job", "j.toml")
        assert out.returncode == 0
        assert out.stdout.splitlines() == registry.load(name).local_command(2, ["--job", "j.toml"])
    bad = run("command", "nope", "2")
    assert bad.returncode == 2 and "unknown backend" in bad.stderr


@pytest.mark.distributed
def test_a_third_backend_plugs_in_by_its_module_and_one_registry_line(monkeypatch, runner, tmp_path):
    """tests/toy_backend.py (one process, identity collectives) and one registry entry: it runs a 1-worker job with
    the shared loop, computes what native computes, and the report gives it its own row, after the registry's."""
    from common.core.registry import BackendEntry
    from tests.conftest import PY, SMOKE, first_divergence, only_result, run

    monkeypatch.setitem(registry.REGISTRY, "toy", BackendEntry(
        "toy", "tests.toy_backend", "one process, no communication", "tab:green", "jobs/slurm/native.sbatch"))
    mod = registry.load("toy")
    assert not inspect.isabstract(mod.ToyBackend) and mod.doctor(None).ok is False
    job = ["--set", "mode=ctl", "--set", "per_replica_batch_size=32"]
    run(mod.local_command(1, ["--job", SMOKE, "--results", str(tmp_path), "--quiet", *job], python=PY))
    toy = only_result(tmp_path)
    assert toy["backend"] == "toy" and toy["world_size"] == 1 and toy["collective"]["used"] == "none"
    native = runner("native", *job, workers=1)  # the parity tests' run: same job, same seed
    assert first_divergence(toy["step_losses"], native["step_losses"], 1e-5) is None
    (summary,) = summarize(load_runs(tmp_path))
    assert summary.backends == ["toy"] and "| toy | 1 | 1x1 | 1 | 1 |" in format_table(summary)
