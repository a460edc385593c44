"""The user's model in a job (``model = "package.module:function"``), imported and called by
``common.workload.usercode``: ``build_model`` returns a model of the job's Keras family (``keras``: 2 = tf_keras, 3 =
Keras 3; the other family is one line naming the key), functional, float32 output under mixed precision, and keeps
what the function's ``compile()`` gave a tf_keras model for ``common.training.compiled`` (``compiled_parts``). A
model function without positional parameters (TensorFlow's tutorial's ``build_and_compile_cnn_model()``) is called
with ``model_args`` only (``takes_model_inputs``; ``common.workload.argcheck`` reads the source by the same rule).
No TensorFlow at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from common.core.errors import one_line
from common.workload.usercode import KERAS3_HINT, UserCodeError, call, function


def build_model(tf: Any, job: Any, input_shape: tuple[int, ...], num_classes: int | None) -> Any:
    """The user's model, ``function(input_shape, num_classes, **model_args)`` (``function(**model_args)`` for a
    function without other positional parameters: ``takes_model_inputs``): a model of the job's Keras family (``keras``:
    2 = tf.keras, i.e. tf_keras; 3 = Keras 3), made functional if it is not (fit needs its inputs, the loss check its
    output shape), its output cast to float32 under mixed precision (Keras 2 only). A tf_keras model the function
    compiled keeps its ``compile()`` for ``compiled_parts``; a compiled Keras 3 model is refused (one line)."""
    ref = job.model
    structured = isinstance(input_shape, dict | list)  # an input function's features: a shape per input
    inputs = (input_shape if structured else tuple(input_shape), num_classes)
    passed = inputs if takes_model_inputs(function("model", ref), job.model_args) else ()
    model = call("model", ref, *passed, **job.model_args)
    if job.keras == 3:
        if getattr(model, "compiled", False) is True:  # keras/src/trainers/trainer.py sets it in compile()
            raise UserCodeError(f"model = {ref!r} returned a compiled Keras 3 model: twinbench cannot carry its "
                                "compile() over to keras = 3 runs; return it uncompiled and set optimizer, "
                                "optimizer_args, learning_rate, loss and metrics in the job")
        return _keras3_model(ref, model, input_shape)
    if not isinstance(model, tf.keras.Model):
        raise UserCodeError(_wrong_family(ref, model, 2))
    compiled = compile_parts(tf, model)
    out = _functional(tf, job, ref, model, input_shape)
    if compiled is not None:
        _COMPILED[id(out)] = (out, compiled)
    return out


def takes_model_inputs(fn: Callable[..., Any], model_args: Iterable[str] = ()) -> bool:
    """Does a model function take twinbench's ``input_shape, num_classes``: yes unless it has no positional
    parameter besides those ``model_args`` names (and no ``*args``), as TensorFlow's tutorial's
    ``build_and_compile_cnn_model()``; one it cannot inspect is passed them. ``common.workload.argcheck`` reads the
    source by the same rule (``model_inputs_rule``)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    return model_inputs_rule([p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
                             any(p.kind == p.VAR_POSITIONAL for p in params), model_args)


def model_inputs_rule(positional: Iterable[str], var_args: bool, model_args: Iterable[str]) -> bool:
    """The rule of ``takes_model_inputs`` on a function's positional parameters' names and its ``*args``."""
    return var_args or bool(set(positional) - set(model_args))


# id(model twinbench returns) -> (that model, its compile() parts): the functional model loses the user's compile
_COMPILED: dict[int, tuple[Any, dict[str, Any]]] = {}


def compiled_parts(model: Any) -> dict[str, Any] | None:
    """What the model function's ``compile()`` gave the model ``build_model`` returned (``compile_parts``), or None
    when it returned the model uncompiled."""
    found = _COMPILED.get(id(model))
    return found[1] if found is not None and found[0] is model else None


def compile_parts(tf: Any, model: Any) -> dict[str, Any] | None:
    """A tf_keras model's ``compile()`` as given (its arguments, the optimizer it made, whether the model class
    overrides ``train_step``), or None for a model never compiled."""
    if not getattr(model, "_is_compiled", False):
        return None
    given = dict(getattr(getattr(model, "_compile_config", None), "config", None) or {})
    return {**given, "optimizer": model.optimizer, "loss": given.get("loss"),
            "train_step": type(model).train_step is not tf.keras.Model.train_step}


def _functional(tf: Any, job: Any, ref: str, model: Any, input_shape: tuple[int, ...]) -> Any:
    """``model`` as a functional tf.keras model of float32 output."""
    try:
        if getattr(model, "_is_graph_network", False):  # functional, or Sequential with a known input
            inputs, outputs = model.inputs, model.output  # one tensor, or a dict / list of them
        else:  # subclassed: called once on a symbolic input
            inputs = tf.keras.Input(shape=tuple(input_shape), name="features")
            outputs = _one_or_structure(tf, model(inputs))
    except Exception as e:
        raise UserCodeError(f"model = {ref!r} cannot take input of shape {tuple(input_shape)}: {one_line(e)}") \
            from None
    if job.mixed_precision:  # as the builtins: the loss sees float32 even under mixed_float16
        flat = tf.nest.flatten(outputs)
        cast = [tf.keras.layers.Activation("linear", dtype="float32", name="float32_output" + (
            f"_{i}" if len(flat) > 1 else ""))(t) for i, t in enumerate(flat)]
        return tf.keras.Model(inputs, tf.nest.pack_sequence_as(outputs, cast), name=model.name)
    if inputs is model.inputs:
        return model
    return tf.keras.Model(inputs, outputs, name=model.name)


def _one_or_structure(tf: Any, outputs: Any) -> Any:
    """A model's outputs: its one tensor (also when wrapped in a list of one), else their structure (a dict of
    outputs by name, a list: common/training/outputs.py)."""
    flat = tf.nest.flatten(outputs)
    return flat[0] if len(flat) == 1 else outputs


def _wrong_family(ref: str, model: Any, keras: int) -> str:
    """Why ``model`` is not a model of the job's Keras family ``keras``: one line naming the keys."""
    kind = f"{type(model).__module__}.{type(model).__name__}"
    if keras == 2 and kind.startswith("keras."):
        return f"model = {ref!r} returned a Keras 3 model ({kind}): set keras = 3 in the job to train it as it is, " \
               f"or {KERAS3_HINT}"
    if keras == 3 and kind.startswith("tf_keras."):
        return f"model = {ref!r} returned a tf_keras (Keras 2) model ({kind}) but the job has keras = 3: build it " \
               "with `import keras` (Keras 3), or set keras = 2"
    return f"model = {ref!r} returned a {kind}, not a {'keras' if keras == 3 else 'tf.keras'}.Model"


def _keras3_model(ref: str, model: Any, input_shape: tuple[int, ...]) -> Any:
    """A Keras 3 model, functional (a subclassed one called once on a symbolic input)."""
    import keras

    if not isinstance(model, keras.Model):
        raise UserCodeError(_wrong_family(ref, model, 3))
    try:
        try:
            inputs, outputs = model.inputs, model.output  # functional, or Sequential with a known input
        except (AttributeError, ValueError):  # subclassed: no graph of its own
            inputs = keras.Input(shape=tuple(input_shape), name="features")
            outputs = _one_or_structure(keras.tree, model(inputs))
    except Exception as e:
        raise UserCodeError(f"model = {ref!r} cannot take input of shape {tuple(input_shape)}: {one_line(e)}") \
            from None
    if inputs is model.inputs:
        return model
    return keras.Model(inputs, outputs, name=model.name)
