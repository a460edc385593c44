"""Models: the same functional tf.keras (legacy Keras 2, tf_keras) graph for both backends, returning logits.

With ``keras = 3`` the builtins are the same graphs in Keras 3: a builder's ``tf`` is then ``keras3_family()``,
whose ``.keras`` is Keras 3 (``import keras``), so ``tf.keras.layers.Dense`` in a builder is Keras 3's.

Builtins are registered in ``MODELS`` (name -> builder and one-line description), each by ``@register`` on its
builder: adding a model touches this file only; ``common.workload.job`` validates names against ``MODELS``, so this
module imports neither ``common.workload.job`` nor, at import time, TensorFlow. Any other name is a
``keras.applications`` constructor of the job's Keras family built with ``weights=None``. The last layer is always
float32 (a linear Activation with dtype float32) so logits and the loss stay float32 under the mixed_float16 policy.
Weights are random from the global seed the caller sets (``tf.keras.utils.set_random_seed(job.seed)``) before
``build_model``; this module never seeds anything. TensorFlow is imported lazily so that importing this module (e.g.
for ``model_names``) stays cheap.
"""

from __future__ import annotations

import difflib
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from common.core.errors import UsageError, one_line
from common.workload import usercode

if TYPE_CHECKING:
    import tensorflow as tf


class ModelError(ValueError, UsageError):
    """The model cannot be built (unknown name, input too small...); the message is one line for the user (exit 2:
    found in every rank before the first step)."""


# Kernel attributes / regularizer attributes of the layers whose kernels get L2 (Conv*, Dense, depthwise and
# separable convolutions); biases, BatchNorm and embeddings are not decayed.
_KERNEL_REGULARIZERS = {"kernel": "kernel_regularizer", "depthwise_kernel": "depthwise_regularizer",
                        "pointwise_kernel": "pointwise_regularizer"}
# Filters of the three stages of the CIFAR ResNets (feature maps 32x32, 16x16, 8x8 on CIFAR).
_RESNET_FILTERS = (16, 32, 64)
# BatchNorm as in the reference CIFAR implementations (torch defaults), rather than Keras' 0.99 / 1e-3.
_BN_MOMENTUM = 0.9
_BN_EPSILON = 1e-5


class ModelJob(Protocol):
    """The job fields models read: a ``common.workload.job.Job`` (not imported here, ``common.workload.job``
    imports this module)."""

    @property
    def model(self) -> str: ...
    @property
    def mlp_hidden(self) -> tuple[int, ...]: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def keras(self) -> int: ...


# (tf module, job, input shape (H, W, C), classes, L2 kernel regularizer or None) -> functional tf.keras.Model whose
# output is ``_logits(tf, x)``; it uses the regularizer on every kernel and never seeds anything.
Builder = Callable[[Any, ModelJob, tuple[int, int, int], int, Any], Any]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str  # one line
    build: Builder
    job_fields: tuple[str, ...] = ()  # model-specific job keys it reads (e.g. mlp_hidden): hashed only for it


MODELS: dict[str, ModelSpec] = {}  # builtin name -> spec, in registration order


def register(name: str, description: str, job_fields: tuple[str, ...] = ()) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to ``MODELS``. Names are lower case, so they never shadow an application."""

    def add(build: Builder) -> Builder:
        if not (name[:1].islower() and name.replace("_", "").isalnum()):
            raise ValueError(f"model name {name!r}: use lower case letters, digits and _ (upper case names are "
                             "tf.keras.applications)")
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered")
        MODELS[name] = ModelSpec(name, description, build, tuple(job_fields))
        return build

    return add


def _tf() -> Any:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 (tf_keras) for tf.keras, before TF loads
    import tensorflow as tf

    return tf


def keras3_family() -> Any:
    """What a builder gets as ``tf`` for a Keras 3 model: ``.keras`` is Keras 3, ``.pad`` its pad op (a TensorFlow op
    cannot take a Keras 3 symbolic tensor)."""
    import keras

    return types.SimpleNamespace(keras=keras, pad=keras.ops.pad)


def model_names() -> list[str]:
    """The builtin model names (any tf.keras.applications constructor name is accepted as well)."""
    return list(MODELS)


def application_names(keras: int = 2) -> list[str]:
    """Constructor names available in the applications of the Keras family ``keras`` (imports TensorFlow)."""
    apps = (keras3_family() if keras == 3 else _tf()).keras.applications
    return sorted(n for n in dir(apps) if n[:1].isupper() and callable(getattr(apps, n)))


def build_model(job: ModelJob, input_shape: tuple[int, ...], num_classes: int | None) -> tf.keras.Model:
    """A functional tf.keras model mapping float32 images [B, *input_shape] to float32 logits [B, num_classes].

    job.weight_decay > 0 puts an L2(weight_decay) regularizer on every Conv/Dense kernel (``model.losses``).
    Raises ModelError (one line) for an unknown model name or an input shape the model cannot take. A user model
    (``model = "package.module:function"``) is built by ``common.workload.usercode.build_model`` (UserCodeError).
    """
    tf = _tf()
    input_shape = tuple(int(d) for d in input_shape)
    if usercode.is_ref(job.model):  # the user's own: twinbench adds nothing but the float32 output cast
        return usercode.build_model(tf, job, input_shape, num_classes)
    if num_classes is None:
        raise ModelError(f"model {job.model!r} is a classifier: its labels are not integers, so set num_classes (or "
                         "use a model of your own, model = \"package.module:function\")")
    family = keras3_family() if job.keras == 3 else tf
    reg = family.keras.regularizers.L2(job.weight_decay) if job.weight_decay > 0 else None
    spec = MODELS.get(job.model)
    try:
        if spec is not None:
            model = spec.build(family, job, input_shape, num_classes, reg)
        else:  # not a builtin: an applications name, built in the job's Keras family
            model = _application(family, job.model, input_shape, num_classes, job.weight_decay, job.keras)
    except ModelError:
        raise
    except ValueError as e:  # keras' shape checks (minimum input size, negative dimensions...)
        raise ModelError(f"model {job.model!r} cannot be built for input shape {input_shape} and "
                         f"{num_classes} classes: {one_line(e, with_type=False)}") from None
    return model


def _logits(tf: Any, x: Any) -> Any:
    # float32 output even under mixed_float16: softmax/cross-entropy on float16 logits loses precision
    return tf.keras.layers.Activation("linear", dtype="float32", name="logits")(x)


@register("mlp", "Flatten, then one Dense + ReLU per mlp_hidden width, then the Dense classifier",
          job_fields=("mlp_hidden",))
def _mlp(tf: Any, job: ModelJob, input_shape: tuple[int, int, int], num_classes: int, reg: Any) -> Any:
    L = tf.keras.layers
    inputs = tf.keras.Input(shape=input_shape, name="images")
    x = L.Flatten()(inputs)
    for i, width in enumerate(job.mlp_hidden):
        x = L.Dense(width, activation="relu", kernel_regularizer=reg, name=f"hidden_{i}")(x)
    x = L.Dense(num_classes, kernel_regularizer=reg, name="classifier")(x)
    return tf.keras.Model(inputs, _logits(tf, x), name="mlp")


@register("small_cnn", "the Fashion-MNIST tutorial CNN: 2 x (3x3 conv + 2x2 max-pool), Dense 64, classifier")
def _small_cnn(tf: Any, job: ModelJob, input_shape: tuple[int, int, int], num_classes: int, reg: Any) -> Any:
    L = tf.keras.layers
    inputs = tf.keras.Input(shape=input_shape, name="images")
    x = L.Conv2D(32, 3, activation="relu", kernel_regularizer=reg)(inputs)
    x = L.MaxPooling2D(2)(x)
    x = L.Conv2D(64, 3, activation="relu", kernel_regularizer=reg)(x)
    x = L.MaxPooling2D(2)(x)
    x = L.Flatten()(x)
    x = L.Dense(64, activation="relu", kernel_regularizer=reg)(x)
    x = L.Dense(num_classes, kernel_regularizer=reg, name="classifier")(x)
    return tf.keras.Model(inputs, _logits(tf, x), name="small_cnn")


def _cifar_resnet(tf: Any, blocks: int, input_shape: tuple[int, ...], num_classes: int, reg: Any,
                  name: str) -> Any:
    """He et al. 2016 CIFAR ResNet (v1, post-activation): 3x3 conv 16, 3 stages of ``blocks`` basic blocks.

    Down-sampling (stride 2) in the first block of stages 2 and 3, with the paper's parameter-free shortcut
    (option A: subsample by 2, zero-pad the new channels), so ResNet-56 has the paper's 0.85M parameters.
    """
    L = tf.keras.layers

    def conv(x: Any, filters: int, stride: int) -> Any:
        return L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                        kernel_initializer="he_normal", kernel_regularizer=reg)(x)

    def bn(x: Any) -> Any:
        return L.BatchNormalization(momentum=_BN_MOMENTUM, epsilon=_BN_EPSILON)(x)

    inputs = tf.keras.Input(shape=input_shape, name="images")
    x = L.ReLU()(bn(conv(inputs, _RESNET_FILTERS[0], 1)))
    for stage, filters in enumerate(_RESNET_FILTERS):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = L.ReLU()(bn(conv(x, filters, stride)))
            y = bn(conv(y, filters, 1))
            shortcut = x
            if stride != 1 or x.shape[-1] != filters:
                # option A: x[:, ::2, ::2] has the size of a stride-2 "same" conv output (ceil(H/2))
                extra = filters - x.shape[-1]
                shortcut = x[:, ::stride, ::stride, :]
                shortcut = tf.pad(shortcut, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])
            x = L.ReLU()(L.Add()([y, shortcut]))
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(num_classes, kernel_regularizer=reg, name="classifier")(x)
    return tf.keras.Model(inputs, _logits(tf, x), name=name)


# 6n + 2 layers with n basic blocks per stage (He et al. 2016, section 4.2)
@register("resnet20", "CIFAR ResNet-20 (He et al. 2016, n=3, 0.27M parameters): the smallest, a quick BatchNorm model")
def _resnet20(tf: Any, job: ModelJob, input_shape: tuple[int, int, int], num_classes: int, reg: Any) -> Any:
    return _cifar_resnet(tf, 3, input_shape, num_classes, reg, name="resnet20")


@register("resnet56", "CIFAR ResNet-56 (He et al. 2016, n=9, 0.85M parameters)")
def _resnet56(tf: Any, job: ModelJob, input_shape: tuple[int, int, int], num_classes: int, reg: Any) -> Any:
    return _cifar_resnet(tf, 9, input_shape, num_classes, reg, name="resnet56")


def _application(tf: Any, name: str, input_shape: tuple[int, ...], num_classes: int, weight_decay: float,
                 keras: int) -> Any:
    apps = tf.keras.applications
    ctor = getattr(apps, name, None)
    if not name[:1].isupper() or not callable(ctor):
        valid = application_names(keras)
        close = difflib.get_close_matches(name, valid, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ModelError(f"unknown model {name!r}: {hint}use one of {', '.join(MODELS)} or a "
                         f"keras.applications name ({len(valid)} available, e.g. ResNet50, MobileNetV2, "
                         "EfficientNetB0, DenseNet121)")
    try:
        base = ctor(weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)
    except TypeError as e:  # a constructor without these arguments is not an ImageNet-style classifier
        raise ModelError(f"model {name!r} cannot be built as a classifier: {one_line(e, with_type=False)}") from None
    if weight_decay > 0:
        base = _with_kernel_l2(tf, base, weight_decay)
    return tf.keras.Model(base.inputs, _logits(tf, base.outputs[0]), name=base.name)


def _with_kernel_l2(tf: Any, model: Any, weight_decay: float) -> Any:
    """The same architecture rebuilt from its config with L2 regularizers on every kernel.

    Setting the regularizer attributes and rebuilding (rather than ``add_loss`` closures) keeps the
    regularizers in the layer configs, so they survive cloning / serialisation exactly like the builtins'.
    The rebuilt model gets fresh weights, still deterministic under the caller's global seed.
    """
    for layer in model.layers:
        pairs = list(_KERNEL_REGULARIZERS.items())
        if not hasattr(layer, "depthwise_kernel"):  # Keras 3's DepthwiseConv2D names its depthwise kernel "kernel"
            pairs.append(("kernel", "depthwise_regularizer"))
        for kernel, reg_attr in pairs:
            if getattr(layer, kernel, None) is not None and hasattr(layer, reg_attr):
                setattr(layer, reg_attr, tf.keras.regularizers.L2(weight_decay))
    return tf.keras.Model.from_config(model.get_config())
