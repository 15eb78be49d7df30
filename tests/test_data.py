import numpy as np
import pytest

from amp_compare.kit.data import batch_plan, epoch_batches, load_dataset, resize_bilinear


@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_datasets_are_deterministic_and_well_formed(name):
    a, b = load_dataset(name), load_dataset(name)
    for attr in ("x_train", "y_train", "x_val", "y_val"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr))
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert a.x_train.ndim == 4 and a.x_train.shape[1:] == a.x_val.shape[1:]
    assert set(np.unique(a.y_train)) == set(range(a.num_classes))
    assert abs(float(a.x_train.mean())) < 1e-3  # standardised on the training split


def test_digits_is_the_real_sklearn_set_resized():
    d = load_dataset("digits")
    assert len(d.x_train) + len(d.x_val) == 1797
    assert d.input_shape == (16, 16, 1)


def test_resize_keeps_corners_and_constant_images():
    img = np.arange(16, dtype=float).reshape(1, 4, 4)
    out = resize_bilinear(img, 7)
    assert out.shape == (1, 7, 7)
    assert out[0, 0, 0] == img[0, 0, 0] and out[0, -1, -1] == img[0, -1, -1]
    np.testing.assert_allclose(resize_bilinear(np.full((2, 3, 3), 5.0), 8), 5.0)


def test_epoch_batches_shuffle_per_seed_and_epoch_without_repeats():
    plan = epoch_batches(100, 16, seed=3, epoch=0)
    assert plan.shape == (6, 16)
    assert len(np.unique(plan)) == plan.size  # no image twice in an epoch
    np.testing.assert_array_equal(plan, epoch_batches(100, 16, seed=3, epoch=0))
    assert not np.array_equal(plan, epoch_batches(100, 16, seed=3, epoch=1))
    assert not np.array_equal(plan, epoch_batches(100, 16, seed=4, epoch=0))
    assert batch_plan(100, 16, 3, 2, cap=2).shape == (2, 2, 16)


def test_augmentation_is_one_seeded_implementation():
    from amp_compare.kit.data import epoch_images

    data = load_dataset("synthetic")
    a, b = epoch_images(data, 3, 0, True), epoch_images(data, 3, 0, True)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, epoch_images(data, 3, 1, True))
    assert epoch_images(data, 3, 0, False) is data.x_train
    # padding shows as the normalised value of black in some border pixels
    assert np.isclose(a[:, 0, :, :], data.fill).any()


def _keras_batches(data, plan, augment: bool, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batches keras_impl's train_step really sees in fit(), recorded eagerly."""
    import keras

    from amp_compare.contract.config import RunConfig
    from amp_compare.keras_impl.loop import AmpModel, StepRecorder
    from amp_compare.keras_impl.train import make_dataset, make_model, make_optimizer

    seen = []

    class Spy(AmpModel):
        def batch(self, batch_data):
            x, y = super().batch(batch_data)
            seen.append((x.numpy(), y.numpy()))
            return x, y

    epochs, steps, batch = plan.shape  # make_dataset reads the same plan from the cell's config
    cfg = RunConfig(framework="tf", dataset="synthetic", seed=seed, augment=augment, init="framework",
                    batch_size=batch, epochs=epochs, steps_per_epoch=steps)
    from amp_compare.keras_impl.amp import mixed_precision

    # the cell's own policy, as its setup() sets it: a test run before this one in the same worker may have left
    # a mixed global policy behind, and compile() would then wrap the optimizer in a loss scaler of its own
    mixed_precision(cfg.precision)
    model = make_model(cfg, data)
    model = Spy(inputs=model.inputs, outputs=model.outputs)
    model.compile(optimizer=make_optimizer(cfg, model.trainable_variables),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  run_eagerly=True)
    dataset, model.device_images = make_dataset(cfg, data)
    from amp_compare.kit.child import Progress, TrainResult
    from amp_compare.kit.training import StepBook

    book = StepBook(cfg, TrainResult(), Progress(stream=open("/dev/null", "w")), lambda: {}, None)
    recorder = StepRecorder(book, plan.shape[1], augment=(data, model.device_images) if augment else None)
    model.fit(dataset, epochs=plan.shape[0], steps_per_epoch=plan.shape[1], verbose=0, callbacks=[recorder])
    return seen


@pytest.mark.parametrize("augment", [False, True])
def test_both_frameworks_get_identical_batches(augment):
    import torch

    from amp_compare.contract.config import RunConfig
    from amp_compare.kit.data import epoch_images
    from amp_compare.torch_impl.train import make_dataset as torch_dataset
    from amp_compare.torch_impl.train import to_device_images

    data = load_dataset("synthetic")
    plan = batch_plan(len(data.x_train), 32, seed=7, epochs=2, cap=3)
    keras_batches = _keras_batches(data, plan, augment, seed=7)
    assert len(keras_batches) == 6
    _, y_torch, _, _ = torch_dataset(RunConfig(framework="torch", dataset="synthetic", device="cpu"), data)
    for k, (epoch, step) in enumerate((e, s) for e in range(2) for s in range(3)):
        idx = plan[epoch, step]
        images = epoch_images(data, 7, epoch, augment)  # what both frameworks train on this epoch
        x_torch = to_device_images(images, torch.device("cpu"))[torch.from_numpy(idx)]  # as torch_impl gathers
        np.testing.assert_array_equal(x_torch.permute(0, 2, 3, 1).numpy(), keras_batches[k][0])
        np.testing.assert_array_equal(y_torch[torch.from_numpy(idx)].numpy(), keras_batches[k][1])
        np.testing.assert_array_equal(keras_batches[k][0], images[idx])
    if augment:
        assert not np.array_equal(keras_batches[0][0], data.x_train[plan[0, 0]])


def test_keras_tf_pipelines_run_without_the_autotuner():
    """fit()'s batches and its validation pass on TensorFlow carry no tf.data autotuner: destroying an iterator
    waited for its thread's sleep (keras_impl/train.untuned); the validation pipeline is every image once, in order."""
    from amp_compare.contract.config import RunConfig
    from amp_compare.keras_impl.train import make_dataset, validation_data

    data = load_dataset("synthetic")
    batches, _ = make_dataset(RunConfig(framework="tf", dataset="synthetic", batch_size=32, epochs=1,
                                        steps_per_epoch=2), data)
    validation, batch_size = validation_data(data)
    assert batch_size is None
    assert [d.options().autotune.enabled for d in (batches, validation)] == [False, False]
    pairs = list(validation.as_numpy_iterator())
    np.testing.assert_array_equal(np.concatenate([x for x, _ in pairs]), data.x_val)
    np.testing.assert_array_equal(np.concatenate([y for _, y in pairs]), data.y_val)


def test_train_samples_known_without_loading_are_the_loaded_ones():
    """kit/schedule.py plans a run's updates from TRAIN_SAMPLES (both children, from the config alone): each bundled
    dataset's count must be what loading it gives (CIFAR's training sets are 50,000 by definition; synthetic_cifar
    is split by the same rule as synthetic)."""
    from amp_compare.kit.data import TRAIN_SAMPLES
    from amp_compare.kit.schedule import lr_factor, run_updates, warmup_updates

    for name in ("digits", "synthetic"):
        assert TRAIN_SAMPLES[name] == len(load_dataset(name).x_train), name
    from amp_compare.contract.config import RunConfig

    cfg = RunConfig(model="vit", dataset="digits", epochs=12, batch_size=64)
    assert run_updates(cfg) == (12 * (TRAIN_SAMPLES["digits"] // 64), warmup_updates(12 * 22, 0.1)) == (264, 26)
    factors = [lr_factor(u, 264, 26) for u in range(264)]
    assert factors[0] == 1 / 26 and factors[25] == 1.0 and factors[26] == 1.0  # warm-up, then the cosine's top
    assert all(a >= b for a, b in zip(factors[26:], factors[27:])) and 0 < factors[-1] < 1e-3
