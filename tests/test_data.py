import numpy as np
import pytest

from common.data import batch_plan, epoch_batches, load_dataset, resize_bilinear


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
    from common.data import epoch_images

    data = load_dataset("synthetic")
    a, b = epoch_images(data, 3, 0, True), epoch_images(data, 3, 0, True)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, epoch_images(data, 3, 1, True))
    assert epoch_images(data, 3, 0, False) is data.x_train
    # padding shows as the normalised value of black in some border pixels
    assert np.isclose(a[:, 0, :, :], data.fill).any()


def test_both_frameworks_get_identical_augmented_batches():
    from common.data import epoch_images
    from tf_impl.train import make_dataset as tf_dataset

    data = load_dataset("synthetic")
    plan = batch_plan(len(data.x_train), 32, seed=5, epochs=2, cap=3)
    tf_batches = list(tf_dataset(data, plan, augment=True, seed=5).as_numpy_iterator())
    for k, (epoch, step) in enumerate((e, s) for e in range(2) for s in range(3)):
        expected = epoch_images(data, 5, epoch, True)[plan[epoch, step]]  # what torch_impl gathers
        np.testing.assert_array_equal(tf_batches[k][0], expected)


def test_both_frameworks_get_identical_batches():
    import torch

    from tf_impl.train import make_dataset as tf_dataset
    from torch_impl.train import make_dataset as torch_dataset

    data = load_dataset("synthetic")
    plan = batch_plan(len(data.x_train), 32, seed=7, epochs=2, cap=4)
    x_torch, y_torch, _, _ = torch_dataset(data, torch.device("cpu"))
    tf_batches = list(tf_dataset(data, plan).as_numpy_iterator())
    assert len(tf_batches) == 8
    for k, idx in enumerate(plan.reshape(-1, 32)):
        xt = x_torch[torch.from_numpy(idx)].permute(0, 2, 3, 1).numpy()  # back to NHWC
        np.testing.assert_array_equal(xt, tf_batches[k][0])
        np.testing.assert_array_equal(y_torch[torch.from_numpy(idx)].numpy(), tf_batches[k][1])
        np.testing.assert_array_equal(tf_batches[k][0], data.x_train[idx])
