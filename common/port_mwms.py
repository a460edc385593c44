"""``<stem>_mwms.py``: a Horovod TensorFlow 2 script ported to ``tf.distribute.MultiWorkerMirroredStrategy`` as a user
would write it, by a line-level rewrite of the script's own source guided by its syntax tree (never regenerated code,
never imported or run).

What changes (each changed line carries a short comment naming the Horovod line it replaces):

- the Horovod imports are commented out; a few helpers are written after the script's imports (``make_strategy``,
  and where used ``is_chief``, ``worker_index``, ``write_filepath``/``remove_worker_copy``, the warm-up callbacks);
- ``hvd.init()`` becomes ``strategy = make_strategy()``: ``SlurmClusterResolver`` under srun (``SLURM_PROCID`` set and
  no ``TF_CONFIG``), else ``TFConfigClusterResolver`` (no ``TF_CONFIG``: one worker alone). The GPU set-up that
  followed ``hvd.init()`` is moved before it (MWMS starts TensorFlow's runtime, after which devices cannot be
  configured), the ``hvd.local_rank()`` pinning dropped (one worker per GPU, given by srun or
  ``CUDA_VISIBLE_DEVICES``);
- ``hvd.size()``: ``strategy.num_replicas_in_sync``; ``hvd.rank() == 0``: ``is_chief(strategy)``; ``hvd.rank()``:
  ``worker_index(strategy)``;
- the model and optimizer statements are wrapped in ``with strategy.scope():``;
- ``dataset.batch(b)``: ``batch(b * strategy.num_replicas_in_sync)`` (MWMS batches globally and splits each batch
  over the replicas: b per replica, as under Horovod); ``dataset.shard(hvd.size(), hvd.rank())`` removed (the
  strategy shards the dataset itself: ``AutoShardPolicy.AUTO``);
- ``DistributedOptimizer`` / ``DistributedGradientTape`` unwrapped (MWMS all-reduces the gradients in
  ``apply_gradients``), broadcasts and ``MetricAverageCallback`` removed with the reason, the warm-up and schedule
  callbacks replaced by local ones doing what Horovod's do, a rank-0 checkpoint saved by every worker (non-chief
  copies to a temporary directory that is removed);
- a custom training step: called through ``strategy.run`` on ``strategy.experimental_distribute_dataset``, its loss
  averaged over the global batch (``tf.nn.compute_average_loss``) and the per-replica losses summed
  (``strategy.reduce``).

What it cannot port (``hvd.elastic``, ``hvd.broadcast``/``allreduce`` of the script's own values,
``backward_passes_per_step`` > 1, an unknown callback, a loss it cannot read) is commented out in place or dropped
with a comment, and named in the returned list as ``file:line: what``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

INDENT = "    "
GPU_SETUP = ("set_memory_growth", "set_visible_devices", "list_physical_devices", "set_logical_device_configuration",
             "set_virtual_device_configuration", "visible_device_list")
SAVES = ("save", "save_weights")  # checkpoint.save(path), model.save(path), model.save_weights(path)
BROADCAST_WHY = ("every worker's variables start equal: MWMS creates each from worker 0's initial value, "
                 "broadcast at creation")
METRICS_WHY = ("Keras fit under MWMS gives callbacks epoch-end metrics over every worker's data (its metric "
               "variables are summed over the workers when read; the per-batch progress bar shows the workers' sum)")
UNWRAP_WHY = ("MWMS all-reduces the gradients itself (apply_gradients sums them over replicas; the loss is per "
              "global batch)")
FP16_WHY = "no fp16 compression in MWMS: it all-reduces gradients in their own dtype (CommunicationOptions has none)"
PIN_WHY = "one worker per GPU: srun (--gpus-per-task=1) or CUDA_VISIBLE_DEVICES gives each worker its GPU"
SAVE_WHY = ("every worker saves (saving may read variables every worker must take part in); non-chief "
            "workers write a temporary copy that is removed, the chief's is kept")

STRATEGY_HELPER = '''
PORT_BASE = 12345  # first port of each node's workers under srun (SlurmClusterResolver's own default is 8888)


def make_strategy():
    """MultiWorkerMirroredStrategy for this worker (replaces hvd.init()). Under srun without TF_CONFIG: the cluster
    from Slurm's variables, one worker per task; else from TF_CONFIG (none: this process alone). A worker's
    replicas are the GPUs it sees (one per worker, as srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES leaves it;
    none: its CPU)."""
    if "SLURM_PROCID" in os.environ and "TF_CONFIG" not in os.environ:
        # gpus_per_node only makes the resolver list every task of the busiest node: with auto_set_gpu=False it
        # assigns no device (it would overwrite the CUDA_VISIBLE_DEVICES srun set)
        tasks = max(int(n.split("(")[0]) for n in os.environ["SLURM_STEP_TASKS_PER_NODE"].split(","))
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=PORT_BASE, gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False)
        spec = slurm.cluster_spec()  # sets slurm.task_id
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type="worker", task_id=slurm.task_id,
            num_accelerators={"GPU": len(tf.config.list_physical_devices("GPU"))}, rpc_layer="grpc")
    else:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
'''
RANK_HELPERS = '''

def worker_index(strategy):
    """This worker's index in the cluster (hvd.rank()); 0 for a worker alone."""
    return strategy.cluster_resolver.task_id or 0


def is_chief(strategy):
    """Worker 0 (hvd.rank() == 0): the one that prints and whose checkpoint is kept; a worker alone is the chief."""
    resolver = strategy.cluster_resolver
    return resolver.task_type in (None, "chief") or (
        resolver.task_type == "worker" and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())
'''
SAVE_HELPERS = '''

def write_filepath(filepath, strategy):
    """Where this worker saves ``filepath``: the chief there, another worker in a temporary directory beside it
    (TensorFlow's multi-worker tutorial; remove_worker_copy deletes it after the save)."""
    dirpath, base = os.path.split(filepath)
    if not is_chief(strategy):
        dirpath = os.path.join(dirpath, "workertemp_%d" % worker_index(strategy))
        tf.io.gfile.makedirs(dirpath)
    return os.path.join(dirpath, base)


def remove_worker_copy(filepath, strategy):
    """After every worker saved: a non-chief worker deletes its temporary copy."""
    if not is_chief(strategy):
        tf.io.gfile.rmtree(os.path.dirname(write_filepath(filepath, strategy)))
'''
SCHEDULE_HELPERS = '''

class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """hvd.callbacks.LearningRateScheduleCallback without Horovod (horovod/_keras/callbacks.py, 0.28.1): from
    start_epoch to end_epoch the LR is initial_lr * multiplier(epoch) (a number m: m ** (epoch - start_epoch)), set at
    each epoch's first batch (staircase) or at every batch at its fractional epoch; with momentum_correction the
    momentum is scaled by new LR / old LR for that batch (where the optimizer holds it in a variable)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch, self.current_epoch, self.restore_momentum = steps_per_epoch, None, None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params["steps"]

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def _adjust(self, epoch):
        optimizer = self.model.optimizer
        old_lr = tf.keras.backend.get_value(optimizer.learning_rate)
        new_lr = self.initial_lr * self.multiplier(epoch)
        tf.keras.backend.set_value(optimizer.learning_rate, new_lr)
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and isinstance(momentum, tf.Variable):
            self.restore_momentum = tf.keras.backend.get_value(momentum)
            tf.keras.backend.set_value(momentum, self.restore_momentum * new_lr / old_lr)

    def on_train_batch_end(self, batch, logs=None):
        if self.restore_momentum:
            tf.keras.backend.set_value(self.model.optimizer.momentum, self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = tf.keras.backend.get_value(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """hvd.callbacks.LearningRateWarmupCallback without Horovod: over warmup_epochs the LR rises from
    initial_lr / replicas to initial_lr, at every batch (Goyal et al. 2017), replicas being the strategy's
    num_replicas_in_sync (hvd.size())."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            replicas = self.model.distribute_strategy.num_replicas_in_sync
            epoch += 1.0 / self.steps_per_epoch  # round numbers at each epoch's end, as Horovod's
            return 1.0 / replicas * (epoch * (replicas - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and is_chief(self.model.distribute_strategy):
            print("\\nEpoch %d: finished gradual learning rate warmup to %g." % (
                epoch + 1, tf.keras.backend.get_value(self.model.optimizer.learning_rate)))
'''


@dataclass
class Port:
    """The edits of one script: span edits on the source (phase A, line count kept), then line operations."""

    source: str
    tree: ast.Module
    script: Path
    lines: list[str] = field(init=False)
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # absolute char offsets, replacement
    before: dict[int, list[tuple[str, bool]]] = field(default_factory=dict)  # line -> (text, follows the shift)
    after: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # line -> (indent-giving line, text)
    trail: dict[int, list[str]] = field(default_factory=dict)  # line -> trailing comments
    commented: dict[int, int] = field(default_factory=dict)  # line -> column where "# " goes
    dropped: set[int] = field(default_factory=set)
    shift: dict[int, int] = field(default_factory=dict)  # line -> extra indentation (negative: dedent)
    moved: dict[int, list[int]] = field(default_factory=dict)  # line -> lines emitted before it instead
    removed: set[int] = field(default_factory=set)  # id() of statements taken out
    handled: set[int] = field(default_factory=set)  # id() of nodes already rewritten
    distributed: set[int] = field(default_factory=set)  # id() of loops now over the distributed dataset
    notes: list[str] = field(default_factory=list)
    uses: set[str] = field(default_factory=set)  # helpers the port uses
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> horovod module path
    parents: dict[int, ast.AST] = field(default_factory=dict)
    init: ast.stmt | None = None

    def __post_init__(self) -> None:
        self.lines = self.source.splitlines()
        self._starts = [0]
        for line in self.source.splitlines(keepends=True):
            self._starts.append(self._starts[-1] + len(line))
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node

    # -- positions and source --------------------------------------------------------------------------------
    def offset(self, line: int, col: int) -> int:
        """Absolute character offset of (1-based line, UTF-8 byte column)."""
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self._starts[line - 1] + len(text.encode()[:col].decode(errors="ignore"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def text(self, node: ast.AST) -> str:
        return self.source[self.start(node):self.end(node)]

    def note(self, node: ast.AST, what: str) -> None:
        line = f"{self.script.name}:{getattr(node, 'lineno', 0)}: {what}"
        if line not in self.notes:
            self.notes.append(line)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def statement(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parents[id(node)]
        return node

    def indent_of(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[:len(text) - len(text.lstrip())]

    # -- edits -----------------------------------------------------------------------------------------------
    def replace(self, node: ast.AST, new: str, was: str | None = None) -> None:
        self.spans.append((self.start(node), self.end(node), new))
        self.handled.add(id(node))
        if was:
            self.comment(node.lineno, was)  # type: ignore[attr-defined]

    def comment(self, line: int, what: str) -> None:
        if what not in self.trail.setdefault(line, []):
            self.trail[line].append(what)

    def remove(self, stmt: ast.stmt, why: str) -> None:
        """Comment the statement out in place, a line above saying why."""
        if id(stmt) in self.removed:
            return
        self.removed.add(id(stmt))
        col = len(self.indent_of(stmt.lineno))
        for line in range(stmt.lineno, stmt.end_lineno + 1):  # type: ignore[operator]
            self.commented.setdefault(line, col)
        self.before.setdefault(stmt.lineno, []).append((f"# MWMS: {why}", True))

    def insert(self, offset: int, text: str) -> None:
        self.spans.append((offset, offset, text))

    def drop_lines(self, first: int, last: int, col: int) -> None:
        for line in range(first, last + 1):
            self.commented.setdefault(line, col)

    def covered(self, node: ast.AST) -> bool:
        """Inside a statement taken out or a span already rewritten."""
        cur: ast.AST | None = node
        while cur is not None:
            if id(cur) in self.removed or id(cur) in self.handled:
                return True
            cur = self.parent(cur)
        return False


# -- Horovod names ----------------------------------------------------------------------------------------------
MODULE_PARTS = ("horovod", "tensorflow", "keras", "_keras")


def hvd_name(p: Port, node: ast.AST) -> str | None:
    """``callbacks.MetricAverageCallback`` for ``hvd.callbacks.MetricAverageCallback`` (any alias), else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in p.aliases:
        return None
    full = p.aliases[node.id].split(".") + parts
    while full and full[0] in MODULE_PARTS and len(full) > 1:
        full.pop(0)
    return ".".join(full)


def horovod_refs(p: Port) -> list[tuple[ast.AST, str]]:
    """Every use of a Horovod name (the whole attribute chain), outermost first."""
    refs = []
    for node in ast.walk(p.tree):
        if isinstance(node, ast.Name) and node.id in p.aliases:
            top: ast.AST = node
            while isinstance(p.parent(top), ast.Attribute) and p.parent(top).value is top:  # type: ignore[union-attr]
                top = p.parent(top)  # type: ignore[assignment]
            name = hvd_name(p, top)
            if name is not None:
                refs.append((top, name))
    return sorted(refs, key=lambda r: (p.start(r[0]), -p.end(r[0])))


def called(p: Port, node: ast.AST) -> ast.Call | None:
    par = p.parent(node)
    return par if isinstance(par, ast.Call) and par.func is node else None


def imports(p: Port) -> ast.stmt | None:
    """Record the Horovod aliases, comment out their imports; the last top-level import (helpers go after it)."""
    last = None
    for stmt in ast.walk(p.tree):
        if isinstance(stmt, ast.Import):
            names = [(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
                     for a in stmt.names if a.name == "horovod" or a.name.startswith("horovod.")]
        elif isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == "horovod":
            names = [(a.asname or a.name, f"{stmt.module}.{a.name}") for a in stmt.names]
        else:
            continue
        p.aliases.update(names)
        if names:
            p.remove(stmt, "Horovod is not used: tf.distribute.MultiWorkerMirroredStrategy below")
    for stmt in p.tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            last = stmt
        elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            break
    return last


def bound_names(tree: ast.Module) -> set[str]:
    out = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            out.update((a.asname or a.name.split(".")[0]) for a in stmt.names)
    return out


def is_gpu_setup(p: Port, stmt: ast.stmt) -> bool:
    for node in ast.walk(stmt):
        if isinstance(node, ast.Attribute) and node.attr in GPU_SETUP:
            return True
        if isinstance(node, ast.Constant) and node.value == "CUDA_VISIBLE_DEVICES":
            return True
        if hvd_name(p, node) == "local_rank":
            return True
    return False


def body_of(p: Port, stmt: ast.stmt) -> list[ast.stmt]:
    par = p.parent(stmt)
    for name in ("body", "orelse", "finalbody"):
        block = getattr(par, name, None)
        if isinstance(block, list) and stmt in block:
            return block
    return [stmt]


def enclosing_function(p: Port, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    cur = p.parent(node)
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef):
        cur = p.parent(cur)
    return cur  # type: ignore[return-value]


# -- hvd.init(): the strategy, after the GPU set-up -------------------------------------------------------------
STRATEGY_LINE = "strategy = make_strategy()"
STRATEGY_WAS = "was hvd.init(): MultiWorkerMirroredStrategy from Slurm's variables or TF_CONFIG"


def comments_above(p: Port, stmt: ast.stmt) -> int:
    """The first line of the comment lines directly above ``stmt`` (its own line if none)."""
    first = stmt.lineno
    while first > 1 and p.lines[first - 2].strip().startswith("#"):
        first -= 1
    return first


def strategy_at_init(p: Port, refs: list[tuple[ast.AST, str]]) -> None:
    inits = [node for node, name in refs if name == "init" and called(p, node)]
    if not inits:
        p.note(p.tree.body[0] if p.tree.body else p.tree, "no hvd.init(): make the strategy by hand "
               "(strategy = make_strategy()) before the model")
        return
    call = called(p, inits[0])
    stmt = p.statement(inits[0])
    if len(inits) > 1 or not (isinstance(stmt, ast.Expr) and stmt.value is call):
        p.note(stmt, "hvd.init() inside an expression or called more than once: strategy made by hand")
        return
    p.init = stmt
    p.handled.add(id(inits[0]))
    block = body_of(p, stmt)
    after_init = block[block.index(stmt) + 1:]
    gpu = [s for s in after_init if is_gpu_setup(p, s)]
    fn = enclosing_function(p, stmt)
    lines = [f"{STRATEGY_LINE}  # {STRATEGY_WAS}"]
    if fn is not None and any(not inside(p, n, fn) for n, name in refs if name != "init"):
        lines.insert(0, "global strategy  # MWMS: hvd was module state; other functions read the strategy too")
    if gpu and after_init[:len(gpu)] == gpu:  # the set-up follows hvd.init(): the strategy after it
        p.remove(stmt, "the strategy is made below, after the GPU set-up (MWMS starts TensorFlow's runtime, after "
                       "which devices cannot be configured)")
        p.after.setdefault(gpu[-1].end_lineno, []).extend(  # type: ignore[arg-type]
            (stmt.lineno, line) for line in lines)
        return
    p.replace(stmt, STRATEGY_LINE, STRATEGY_WAS)
    p.before.setdefault(stmt.lineno, []).extend((line, True) for line in lines[:-1])
    for s in gpu:
        first = comments_above(p, s)
        p.moved.setdefault(stmt.lineno, []).extend(range(first, s.end_lineno + 1))  # type: ignore[operator]
    if gpu:
        p.before.setdefault(comments_above(p, gpu[0]), []).insert(0, (
            "# MWMS: GPU set-up moved here, before the strategy (MWMS starts TensorFlow's runtime, after which "
            "devices cannot be configured)", True))


def inside(p: Port, node: ast.AST, ancestor: ast.AST) -> bool:
    cur = p.parent(node)
    while cur is not None:
        if cur is ancestor:
            return True
        cur = p.parent(cur)
    return False


# -- rank-0 checkpoints: saved by every worker -------------------------------------------------------------------
def rank0_test(p: Port, test: ast.AST) -> bool:
    return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.left, ast.Call) and hvd_name(p, test.left.func) == "rank"
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0)


def save_call(stmt: ast.stmt) -> ast.Call | None:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args \
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr in SAVES:
        return stmt.value
    return None


def keras_checkpoint(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Name | ast.Attribute) and getattr(n, "id", getattr(n, "attr", "")) in
               ("ModelCheckpoint", "BackupAndRestore") for n in ast.walk(stmt))


def hoist_saves(p: Port) -> None:
    """A checkpoint Horovod saved on rank 0 only: saved by every worker, only the chief's copy kept."""
    for node in ast.walk(p.tree):
        if not isinstance(node, ast.If):
            continue
        saves = [s for s in node.body if save_call(s) or keras_checkpoint(s)]
        if not saves:
            continue
        if not rank0_test(p, node.test) or node.orelse:
            if any(hvd_name(p, n) == "rank" for n in ast.walk(node.test)):
                p.note(node, "a checkpoint saved under a condition on hvd.rank(): MWMS needs every worker to save "
                             "(write_filepath, remove_worker_copy): by hand")
            continue
        for s in saves:
            call = save_call(s)
            if call is not None:
                path = p.text(call.args[0])
                p.insert(p.start(call.args[0]), "write_filepath(")
                p.insert(p.end(call.args[0]), ", strategy)")
                p.after.setdefault(s.end_lineno, []).append(  # type: ignore[arg-type]
                    (s.lineno, f"remove_worker_copy({path}, strategy)  # MWMS: the non-chief copy removed"))
                p.uses.add("save")
            p.comment(s.lineno, "every worker saves: was under hvd.rank() == 0")
        delta = len(p.indent_of(node.body[0].lineno)) - len(p.indent_of(node.lineno))
        if len(saves) == len(node.body) and node.body[0].lineno > node.test.end_lineno:  # type: ignore[operator]
            p.handled.add(id(node.test))
            p.dropped.update(range(node.lineno, node.test.end_lineno + 1))  # type: ignore[operator]
            p.before.setdefault(node.lineno, []).append((f"# MWMS: {SAVE_WHY} (was under hvd.rank() == 0)", False))
            for line in range(node.body[0].lineno, node.end_lineno + 1):  # type: ignore[operator]
                p.shift[line] = p.shift.get(line, 0) - delta
        else:
            for s in saves:
                lines = range(comments_above(p, s), s.end_lineno + 1)  # type: ignore[operator]
                p.moved.setdefault(node.lineno, []).extend(lines)
                for line in lines:
                    p.shift[line] = p.shift.get(line, 0) - delta
            p.before.setdefault(comments_above(p, saves[0]), []).insert(
                0, (f"# MWMS: moved out of the rank-0 block: {SAVE_WHY}", True))
# -- every other Horovod name -----------------------------------------------------------------------------------
DROPPED_CALLBACKS = {"callbacks.BroadcastGlobalVariablesCallback": BROADCAST_WHY,
                     "callbacks.MetricAverageCallback": METRICS_WHY}
LOCAL_CALLBACKS = ("callbacks.LearningRateWarmupCallback", "callbacks.LearningRateScheduleCallback")
FINE_KEYWORDS = ("average_aggregated_gradients", "sparse_as_dense", "device_dense", "device_sparse", "name",
                 "compression", "backward_passes_per_step", "persistent")


def rewrite_refs(p: Port, refs: list[tuple[ast.AST, str]]) -> None:
    for node, name in refs:
        if p.covered(node):
            continue
        call, stmt = called(p, node), p.statement(node)
        if name == "size" and call:
            p.replace(call, "strategy.num_replicas_in_sync", "was hvd.size(): one replica per worker")
        elif name == "rank" and call:
            rank(p, call)
        elif name == "local_rank" and call and is_gpu_setup(p, stmt):
            p.remove(stmt, f"hvd.local_rank() pinning dropped: {PIN_WHY}")
        elif name in ("DistributedOptimizer", "DistributedGradientTape") and call and call.args:
            unwrap(p, call, stmt, name)
        elif name in ("broadcast_variables", "broadcast_global_variables") and isinstance(stmt, ast.Expr):
            p.remove(stmt, f"hvd.{name} removed: {BROADCAST_WHY}")
        elif name in DROPPED_CALLBACKS and call:
            drop_callback(p, call, stmt, DROPPED_CALLBACKS[name], name)
        elif name in LOCAL_CALLBACKS and call:
            p.replace(node, name.split(".")[1], f"was hvd.{name}: the same schedule, without Horovod")
            p.uses.update(("schedule", "rank"))
        elif name.startswith("Compression.") and isinstance(stmt, ast.Assign):
            p.remove(stmt, f"hvd.Compression removed: {FP16_WHY}")
        elif name == "allreduce" and call and len(call.args) == 1 and isinstance(call.args[0], ast.Call) \
                and isinstance(call.args[0].func, ast.Attribute) and call.args[0].func.attr == "evaluate":
            p.replace(call, p.text(call.args[0]), "was hvd.allreduce(...): evaluate under MWMS already returns "
                                                  "the metrics over every worker's share")
        elif name == "shutdown" and isinstance(stmt, ast.Expr):
            p.remove(stmt, "MWMS needs no shutdown")
        else:
            not_ported(p, node, stmt, name)


def not_ported(p: Port, node: ast.AST, stmt: ast.stmt, name: str) -> None:
    if name.startswith("elastic"):
        why = (f"hvd.{name}: elastic training has no MWMS counterpart (tf.keras.callbacks.BackupAndRestore "
               "resumes a restarted job): not ported")
    elif name in ("broadcast", "broadcast_object", "allreduce", "allgather", "grouped_allreduce"):
        why = (f"hvd.{name} of the script's own value: not ported (MWMS' counterpart is strategy.reduce or a "
               "collective inside strategy.run); every worker keeps its own value")
    elif name == "run":
        why = "horovod.run starts ranks from Python: MWMS has none (srun, or python -m backends.native --script)"
    else:
        why = f"hvd.{name}: no MWMS counterpart known to the port: not ported"
    p.note(node, why)
    decorator = node
    while p.parent(decorator) is not None and not isinstance(p.parent(decorator), ast.stmt):
        decorator = p.parent(decorator)  # type: ignore[assignment]
    holder = p.parent(decorator)
    if isinstance(holder, ast.FunctionDef | ast.ClassDef) and decorator in holder.decorator_list:
        p.drop_lines(decorator.lineno, decorator.end_lineno,  # type: ignore[attr-defined]
                     len(p.indent_of(decorator.lineno)))  # type: ignore[attr-defined]
        p.handled.add(id(decorator))
        p.before.setdefault(decorator.lineno, []).append((f"# MWMS: {why}", True))  # type: ignore[attr-defined]
        return
    p.remove(stmt, why)


def rank(p: Port, call: ast.Call) -> None:
    p.uses.add("rank")
    test = p.parent(call)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and test.left is call \
            and isinstance(test.ops[0], ast.Eq | ast.NotEq) and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value == 0:
        neg = "not " if isinstance(test.ops[0], ast.NotEq) else ""
        p.replace(test, f"{neg}is_chief(strategy)", f"was {p.text(test)}")
    else:
        p.replace(call, "worker_index(strategy)", "was hvd.rank()")


def unwrap(p: Port, call: ast.Call, stmt: ast.stmt, name: str) -> None:
    """DistributedOptimizer(opt, ...) / DistributedGradientTape(tape, ...): the plain optimizer / tape."""
    extra = []
    for kw in call.keywords:
        value = kw.value
        if kw.arg == "backward_passes_per_step" and not (isinstance(value, ast.Constant) and value.value == 1):
            p.note(kw, f"backward_passes_per_step={p.text(value)}: Horovod sums the gradients of that many batches "
                       "before each update; MWMS has no counterpart: ported with one update per batch")
            extra.append("backward_passes_per_step dropped (not ported)")
        elif kw.arg == "compression":
            extra.append(FP16_WHY)
        elif kw.arg not in FINE_KEYWORDS:
            p.note(kw, f"{name}({kw.arg}=...): no MWMS counterpart: dropped")
            extra.append(f"{kw.arg} dropped (not ported)")
    inner = call.args[0]
    why = "; ".join([f"hvd.{name} removed: {UNWRAP_WHY}", *extra])
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name) and isinstance(inner, ast.Name) \
            and stmt.targets[0].id == inner.id:
        p.remove(stmt, why)
    else:
        p.replace(call, p.text(inner), why)


def drop_callback(p: Port, call: ast.Call, stmt: ast.stmt, why: str, name: str) -> None:
    holder = p.parent(call)
    if isinstance(holder, ast.List):
        others = [e for e in holder.elts if e is not call]
        alone = holder.lineno < call.lineno and call.end_lineno < holder.end_lineno and not any(  # type: ignore
            e.lineno <= call.end_lineno and e.end_lineno >= call.lineno for e in others)  # type: ignore[operator]
        if alone:
            p.drop_lines(call.lineno, call.end_lineno, len(p.indent_of(call.lineno)))  # type: ignore[arg-type]
            p.before.setdefault(call.lineno, []).append((f"# MWMS: hvd.{name} removed: {why}", True))
            p.handled.add(id(call))
        else:
            p.replace(holder, "[" + ", ".join(p.text(e) for e in others) + "]", f"hvd.{name} removed: {why}")
    elif isinstance(holder, ast.Call) and isinstance(stmt, ast.Expr) and stmt.value is holder:
        p.remove(stmt, f"hvd.{name} removed: {why}")
    else:
        not_ported(p, call, stmt, name)


# -- a custom training step: strategy.run on the distributed dataset -------------------------------------------
LOSS_WHY = "loss per global batch: MWMS sums the replicas' gradients (Horovod averaged the workers')"


def port_steps(p: Port, refs: list[tuple[ast.AST, str]]) -> None:
    steps = []
    for node, name in refs:
        if name == "DistributedGradientTape":
            fn = enclosing_function(p, node)
            if fn is None:
                p.note(node, "a DistributedGradientTape outside a function: strategy.run needs the step in a "
                             "function: by hand")
            elif fn not in steps:
                steps.append(fn)
    for fn in steps:
        step_loss(p, fn)
        for call in ast.walk(p.tree):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == fn.name \
                    and not inside(p, call, fn):
                run_step(p, call, fn)


def run_step(p: Port, call: ast.Call, fn: ast.AST) -> None:
    name = fn.name  # type: ignore[attr-defined]
    args = ", ".join(p.text(a) for a in call.args)
    text = name
    if call.args:
        text += f", args=({args},)" if len(call.args) == 1 else f", args=({args})"
    if call.keywords:
        text += ", kwargs={" + ", ".join(f"{k.arg!r}: {p.text(k.value)}" for k in call.keywords) + "}"
    text, why = f"strategy.run({text})", f"was {name}(...): every replica runs the step"
    if isinstance(p.parent(call), ast.Assign):
        text = f"strategy.reduce(tf.distribute.ReduceOp.SUM, {text}, axis=None)"
        why += ", its results summed over replicas"
    p.replace(call, text, why)
    used = {n.id for a in call.args for n in ast.walk(a) if isinstance(n, ast.Name)}
    loop = p.parent(call)
    while loop is not None and not isinstance(loop, ast.For):
        loop = p.parent(loop)
    if isinstance(loop, ast.For) and used & {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} \
            and id(loop) not in p.distributed:
        p.distributed.add(id(loop))
        data = loop.iter
        if isinstance(data, ast.Call) and isinstance(data.func, ast.Name) and data.func.id == "enumerate" \
                and data.args:
            data = data.args[0]
        p.insert(p.start(data), "strategy.experimental_distribute_dataset(")
        p.insert(p.end(data), ")")
        p.comment(loop.lineno, "each worker iterates its share of every global batch")


def step_loss(p: Port, fn: ast.AST) -> None:
    """The step's loss averaged over the global batch (tf.nn.compute_average_loss)."""
    grads = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
             and c.func.attr == "gradient" and c.args and isinstance(c.args[0], ast.Name)]
    if not grads:
        p.note(fn, "a training step without tape.gradient(loss, ...): its loss cannot be found: by hand")
        return
    target = grads[0].args[0].id  # type: ignore[attr-defined]
    assigns = [a for a in ast.walk(fn) if isinstance(a, ast.Assign) and len(a.targets) == 1
               and isinstance(a.targets[0], ast.Name) and a.targets[0].id == target]
    value = assigns[-1].value if assigns else None
    func = value.func if isinstance(value, ast.Call) else None
    if isinstance(func, ast.Name) and (made := loss_object(p, func.id)) is not None:
        if any(k.arg == "reduction" for k in made.keywords):
            p.note(made, "a loss object with its own reduction: MWMS needs per-example losses averaged over the "
                         "global batch (tf.nn.compute_average_loss): by hand")
            return
        last = max([*made.args, *(k.value for k in made.keywords)], key=p.end, default=None)
        p.insert(p.end(last) if last is not None else p.end(made) - 1,
                 ", reduction=tf.keras.losses.Reduction.NONE" if last is not None
                 else "reduction=tf.keras.losses.Reduction.NONE")
        p.comment(made.lineno, "per-example losses: the step averages them over the global batch")
    elif isinstance(func, ast.Attribute) and func.attr in ("reduce_mean",) and len(value.args) == 1 \
            and not value.keywords:  # type: ignore[union-attr]
        p.replace(func, "tf.nn.compute_average_loss", f"was {p.text(func)}: {LOSS_WHY}")
        return
    elif not (isinstance(func, ast.Attribute) and func.attr[:1].islower() and "losses" in p.text(func)):
        p.note(value or fn, "the step's loss: cannot tell how it is reduced; MWMS sums the replicas' gradients: "
                            "average it over the global batch (tf.nn.compute_average_loss) by hand")
        return
    else:  # a per-example loss function: Horovod's tape.gradient differentiated the sum over the batch
        p.comment(value.lineno, "was per example (its gradient the batch's sum): now the global batch's mean, "  # type: ignore
                                "gradients 1/batch of Horovod's")
    p.insert(p.start(value), "tf.nn.compute_average_loss(")  # type: ignore[arg-type]
    p.insert(p.end(value), ")")  # type: ignore[arg-type]
    p.comment(value.lineno, LOSS_WHY)  # type: ignore[union-attr]


def loss_object(p: Port, name: str) -> ast.Call | None:
    """The Keras loss object ``name = tf.keras.losses.Xxx(...)`` the script made, if any."""
    found = None
    for a in ast.walk(p.tree):
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) \
                and a.targets[0].id == name and isinstance(a.value, ast.Call):
            func = a.value.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if last[:1].isupper():
                found = a.value
    return found


# -- the dataset: global batches, sharded by the strategy -------------------------------------------------------
def datasets(p: Port) -> None:
    for node in ast.walk(p.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)) or p.covered(node):
            continue
        if node.func.attr == "shard" and any(hvd_name(p, n) in ("size", "rank") for n in ast.walk(node)):
            unshard(p, node)
        elif node.func.attr == "batch" and node.args:
            size = node.args[0]
            simple = isinstance(size, ast.Name | ast.Attribute | ast.Constant)
            if not simple:
                p.insert(p.start(size), "(")
            p.insert(p.end(size), ("" if simple else ")") + " * strategy.num_replicas_in_sync")
            p.comment(node.lineno, "global batch: MWMS splits it over the replicas (was the batch per worker)")


def unshard(p: Port, call: ast.Call) -> None:
    why = ("was .shard(hvd.size(), hvd.rank()): MWMS shards the dataset over the workers itself "
           "(AutoShardPolicy.AUTO: by file, else by element)")
    stmt = p.statement(call)
    receiver = call.func.value  # type: ignore[attr-defined]
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name) and isinstance(receiver, ast.Name) \
            and receiver.id == stmt.targets[0].id:
        p.remove(stmt, "hvd's shard removed: " + why.split(": ", 1)[1])
        return
    p.spans.append((p.end(receiver), p.end(call), ""))
    p.handled.add(id(call))
    p.comment(call.lineno, why)


# -- the model and optimizer under strategy.scope() --------------------------------------------------------------
def scope(p: Port) -> None:
    if p.init is None:
        return
    models, optimizers = set(), set()
    for node in ast.walk(p.tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in ("compile", "fit", "trainable_variables", "trainable_weights"):
                models.add(node.value.id)
            elif node.attr == "apply_gradients":
                optimizers.add(node.value.id)
        if isinstance(node, ast.keyword) and node.arg == "optimizer" and isinstance(node.value, ast.Name):
            optimizers.add(node.value.id)
    block = body_of(p, p.init)
    names = models | optimizers
    anchors = [s for s in block[block.index(p.init) + 1:] if id(s) not in p.removed and any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)
        or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "compile"
        for n in ast.walk(s))]
    if not anchors:
        p.note(p.init, "the model and optimizer are not made beside hvd.init(): make them under "
                       "`with strategy.scope():` by hand")
        return
    first, last = anchors[0], anchors[-1]
    p.before.setdefault(first.lineno, []).insert(0, (
        "with strategy.scope():  # MWMS: the model and optimizer made under the strategy (their variables mirrored)",
        False))
    strings = multiline_strings(p)
    for line in range(first.lineno, last.end_lineno + 1):  # type: ignore[operator]
        if p.lines[line - 1].strip() and line not in strings:
            p.shift[line] = p.shift.get(line, 0) + len(INDENT)


def multiline_strings(p: Port) -> set[int]:
    """Lines inside a string literal that spans lines (after its first): never re-indented or commented."""
    out: set[int] = set()
    for node in ast.walk(p.tree):
        if isinstance(node, ast.Constant | ast.JoinedStr) and node.end_lineno != node.lineno \
                and isinstance(getattr(node, "value", ""), str | list):
            out.update(range(node.lineno + 1, node.end_lineno + 1))  # type: ignore[operator]
    return out


def empty_bodies(p: Port) -> None:
    """A block whose statements were all taken out: the block goes too, or gets ``pass`` where it must stay."""
    changed = True
    while changed:
        changed = False
        for node in ast.walk(p.tree):
            if not isinstance(node, ast.stmt) or id(node) in p.removed:
                continue
            blocks = [getattr(node, f) for f in ("body", "orelse", "finalbody") if getattr(node, f, None)]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            empty = [b for b in blocks if all(id(s) in p.removed for s in b)]
            if not empty:
                continue
            if len(empty) == len(blocks) and isinstance(node, ast.If | ast.For | ast.While | ast.With):
                p.remove(node, "nothing left in this block")
                changed = True
                continue
            for b in empty:
                if not any(t == "pass" for _, t in p.after.get(b[-1].end_lineno, [])):  # type: ignore[arg-type]
                    p.after.setdefault(b[-1].end_lineno, []).append((b[0].lineno, "pass"))  # type: ignore


# -- helpers, rendering, the file ---------------------------------------------------------------------------------
def helpers(p: Port, last_import: ast.stmt | None) -> None:
    bound = bound_names(p.tree)
    text = [line for line in ("import os" if "os" not in bound else "",
                              "import tensorflow as tf" if "tf" not in bound else "") if line]
    text += ["", "", f"# -- MultiWorkerMirroredStrategy (written by python -m common.port from {p.script.name}; "
                     "it replaces Horovod) --"]
    body = STRATEGY_HELPER
    if p.uses & {"rank", "save", "schedule"}:
        body += RANK_HELPERS
    if "save" in p.uses:
        body += SAVE_HELPERS
    if "schedule" in p.uses:
        body += SCHEDULE_HELPERS
    text += body.strip("\n").split("\n") + [""]
    if last_import is None:
        p.before.setdefault(1, []).extend((t, False) for t in text + [""])
    else:
        p.after.setdefault(last_import.end_lineno, []).extend((0, t) for t in text)  # type: ignore[arg-type]


def apply_spans(p: Port) -> list[str]:
    """The source with every span edit made (none inside a line commented out); the line count is kept."""
    out = p.source
    for start, end, new in sorted(p.spans, key=lambda s: (s[0], s[1]), reverse=True):
        first = p.source.count("\n", 0, start) + 1
        last = p.source.count("\n", 0, end) + 1
        if any(line in p.commented for line in range(first, last + 1)):
            continue
        lost = p.source.count("\n", start, end) - new.count("\n")
        if lost > 0:  # keep the line count: the newlines go inside the closing bracket
            new = new[:-1] + "\n" * lost + new[-1:] if new.endswith(")") else new + "\n" * lost
        out = out[:start] + new + out[end:]
    return out.splitlines()


def render(p: Port) -> str:
    lines = apply_spans(p)
    strings = multiline_strings(p)
    out: list[str] = []

    def indent(i: int) -> str:
        base = len(p.indent_of(i)) + p.shift.get(i, 0) if i > 0 else 0
        return " " * max(base, 0)

    def emit(i: int) -> None:
        line, shift = lines[i - 1], p.shift.get(i, 0)
        for text, follows in p.before.get(i, []):
            out.append((indent(i) if follows else p.indent_of(i)) + text)
        if i not in p.dropped:
            if shift > 0:
                line = " " * shift + line
            elif shift < 0:
                line = line[min(-shift, len(line) - len(line.lstrip(" "))):]
            if i in p.commented:
                col = max(p.commented[i] + shift, 0)
                line = line[:col] + "# " + line[col:] if not line[:col].strip() else "# " + line
            elif p.trail.get(i) and i not in strings and not line.rstrip().endswith("\\"):
                line += "  # " + "; ".join(p.trail[i])
            out.append(line)
        for ref, text in p.after.get(i, []):
            out.append(indent(ref) + text if text else "")

    away = {line for moved in p.moved.values() for line in moved}
    for i in range(1, len(lines) + 1):
        for j in p.moved.get(i, []):
            emit(j)
        if i not in away:
            emit(i)
    return "\n".join(out) + "\n"


def write_mwms(source: str, tree: ast.Module, script: Path, out: Path) -> list[str]:
    """Write ``out / f"{script.stem}_mwms.py"`` (``out`` may also name the file itself): ``script`` ported to
    MultiWorkerMirroredStrategy. Returns what could not be ported, one ``file:line: what`` each.

    Raises ValueError (nothing written) if the port does not parse or still imports Horovod: a bug here."""
    p = Port(source, tree, script)
    last_import = imports(p)
    refs = horovod_refs(p)
    strategy_at_init(p, refs)
    hoist_saves(p)
    port_steps(p, refs)
    datasets(p)
    rewrite_refs(p, refs)
    scope(p)
    empty_bodies(p)
    helpers(p, last_import)
    text = render(p)
    try:
        ported = ast.parse(text)
    except SyntaxError as e:
        raise ValueError(f"{script}: its MWMS port does not parse (line {e.lineno}: {e.msg})") from None
    left = [n.lineno for n in ast.walk(ported) if isinstance(n, ast.Import | ast.ImportFrom) and any(
        (a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] == "horovod" for a in n.names)]
    if left:
        raise ValueError(f"{script}: its MWMS port still imports horovod (line {left[0]})")
    target = out if out.suffix == ".py" else out / f"{script.stem}_mwms.py"
    target.write_text(text)
    return p.notes
