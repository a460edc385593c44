"""common.workload.models: logits, architectures (parameter counts), L2 regularisation, errors, seeded determinism."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads

import numpy as np
import pytest
import tensorflow as tf

from common.workload import data, models
from common.workload.job import Job, JobError
from common.workload.models import ModelError


def build(seed: int = 0, **kw) -> tf.keras.Model:
    job = Job(**kw)
    tf.keras.utils.set_random_seed(seed)  # the caller's job, as in both backends
    shape = kw.pop("image_shape", (28, 28, 1))
    return models.build_model(job, shape, kw.get("num_classes", 10))


def kernel_l2(model: tf.keras.Model) -> float:
    return sum(float(tf.reduce_sum(tf.square(w))) for w in model.trainable_weights
               if w.name.split("/")[-1].split(":")[0] in ("kernel", "depthwise_kernel", "pointwise_kernel"))


@pytest.fixture
def mixed_precision():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_model_names():
    assert models.model_names() == ["mlp", "small_cnn", "resnet20", "resnet56"]


def test_a_model_registered_in_models_alone_is_a_valid_buildable_job_model():
    @models.register("toy_linear", "Flatten + one Dense (test only)")
    def _toy(tf, job, input_shape, num_classes, reg):
        inputs = tf.keras.Input(shape=input_shape, name="images")
        x = tf.keras.layers.Dense(num_classes, kernel_regularizer=reg)(tf.keras.layers.Flatten()(inputs))
        return tf.keras.Model(inputs, models._logits(tf, x), name="toy_linear")

    try:
        assert models.model_names()[-1] == "toy_linear"
        job = Job(model="toy_linear")  # job validation knows it: nothing else was edited
        assert Job(model="toy_linear", mlp_hidden=(3,)).job_hash == job.job_hash  # it reads no mlp_hidden
        model = build(model="toy_linear", num_classes=3, weight_decay=1e-3)
        assert model.count_params() == 784 * 3 + 3 and len(model.losses) == 1
        assert model(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 3)
        with pytest.raises(ValueError, match="already registered"):
            models.register("toy_linear", "again")(_toy)
        with pytest.raises(ValueError, match="lower case"):
            models.register("ToyNet", "would shadow tf.keras.applications names")(_toy)
    finally:
        del models.MODELS["toy_linear"]
    with pytest.raises(JobError, match="unknown model 'toy_linear'"):
        Job(model="toy_linear")


def test_mlp_shape_params_and_logits():
    model = build(model="mlp", mlp_hidden=(64, 32), num_classes=7)
    assert model.count_params() == (784 * 64 + 64) + (64 * 32 + 32) + (32 * 7 + 7)
    assert [type(layer).__name__ for layer in model.layers] == \
        ["InputLayer", "Flatten", "Dense", "Dense", "Dense", "Activation"]  # no dropout / batch norm
    x = np.random.default_rng(0).random((5, 28, 28, 1), dtype=np.float32)
    out = model(x).numpy()
    assert out.shape == (5, 7) and out.dtype == np.float32
    # raw logits, not probabilities
    assert out.min() < 0 or not np.allclose(out.sum(axis=1), 1.0)


def test_small_cnn_is_the_tutorial_cnn():
    model = build(model="small_cnn")
    convs = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Conv2D)]
    assert [(c.filters, c.kernel_size) for c in convs] == [(32, (3, 3)), (64, (3, 3))]
    # 28 -> conv 26 -> pool 13 -> conv 11 -> pool 5: 5*5*64 features into Dense 64
    assert model.count_params() == (9 * 32 + 32) + (9 * 32 * 64 + 64) + (1600 * 64 + 64) + (64 * 10 + 10)
    assert model(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 10)


# He et al. 2016, table 6: ResNet-20 0.27M and ResNet-56 0.85M parameters; 6n + 2 weighted layers, n = 3 and 9.
@pytest.mark.parametrize("name,layers,params", [("resnet20", 20, (0.26e6, 0.28e6)), ("resnet56", 56, (0.84e6, 0.87e6))])
def test_cifar_resnet_architecture(name, layers, params):
    model = build(model=name, image_shape=(32, 32, 3))
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert params[0] < trainable < params[1]
    convs = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Conv2D)]
    dense = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Dense)]
    assert len(convs) + len(dense) == layers
    assert sum(isinstance(layer, tf.keras.layers.BatchNormalization) for layer in model.layers) == layers - 1
    assert sorted({c.filters for c in convs}) == [16, 32, 64]
    out = model(np.zeros((2, 32, 32, 3), np.float32), training=False)
    assert out.shape == (2, 10) and out.dtype == tf.float32


def test_weight_decay_adds_l2_on_kernels_only():
    wd = 1e-3
    plain = build(model="mlp", mlp_hidden=(16,))
    assert plain.losses == []
    model = build(model="mlp", mlp_hidden=(16,), weight_decay=wd)
    assert len(model.losses) == 2  # two Dense kernels, no bias terms
    np.testing.assert_allclose(float(tf.add_n(model.losses)), wd * kernel_l2(model), rtol=1e-5)
    cnn = build(model="small_cnn", weight_decay=wd)
    assert len(cnn.losses) == 4
    np.testing.assert_allclose(float(tf.add_n(cnn.losses)), wd * kernel_l2(cnn), rtol=1e-5)


def test_keras_application_with_weight_decay():
    model = build(model="MobileNetV2", image_shape=(32, 32, 3), num_classes=5, weight_decay=1e-4)
    out = model(np.zeros((2, 32, 32, 3), np.float32), training=False)
    assert out.shape == (2, 5) and out.dtype == tf.float32
    kernels = [w for w in model.trainable_weights
               if w.name.split("/")[-1].split(":")[0] in ("kernel", "depthwise_kernel")]
    assert len(model.losses) == len(kernels) > 50  # every conv, depthwise conv and the classifier
    np.testing.assert_allclose(float(tf.add_n(model.losses)), 1e-4 * kernel_l2(model), rtol=1e-4)


def test_unknown_application_name():
    with pytest.raises(ModelError, match="NoSuchNet") as e:
        build(model="NoSuchNet")
    assert "ResNet50" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ModelError, match="did you mean .*ResNet50"):
        build(model="ResNet5")


def test_input_too_small_is_a_one_line_model_error():
    with pytest.raises(ModelError, match="32x32") as e:
        build(model="ResNet50", image_shape=(28, 28, 1))
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="small_cnn.*Negative dimension") as e:
        build(model="small_cnn", image_shape=(8, 8, 1))
    assert "\n" not in str(e.value) and "{{node" not in str(e.value)


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_same_seed_same_weights(name):
    a, b, c = build(seed=3, model=name), build(seed=3, model=name), build(seed=4, model=name)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert any(not np.array_equal(wa, wc) for wa, wc in zip(a.get_weights(), c.get_weights(), strict=True))


def test_resnet56_same_seed_same_weights():
    a, b = (build(seed=5, model="resnet56", image_shape=(8, 8, 3)) for _ in range(2))
    assert all(np.array_equal(wa, wb) for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True))


def test_logits_stay_float32_under_mixed_precision(mixed_precision):
    model = build(model="resnet56", image_shape=(8, 8, 3))
    assert next(layer for layer in model.layers if isinstance(layer, tf.keras.layers.Conv2D)).compute_dtype == \
        "float16"
    out = model(np.zeros((2, 8, 8, 3), np.float32), training=False)
    assert out.dtype == tf.float32
    mlp = build(model="mlp")
    assert mlp(np.zeros((1, 28, 28, 1), np.float32)).dtype == tf.float32


def test_mlp_learns_the_synthetic_task():
    job = Job(dataset="synthetic", synthetic_samples=256, image_shape=(8, 8, 1), mlp_hidden=(32,), seed=1)
    tf.keras.utils.set_random_seed(job.seed)
    ds = data.make_train_dataset(job, 32, 0, 1)
    model = models.build_model(job, (8, 8, 1), 10)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(ds, steps_per_epoch=8, epochs=5, verbose=0).history["loss"]
    assert hist[-1] < 0.5 * hist[0]
