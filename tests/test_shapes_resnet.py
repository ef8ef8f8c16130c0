import numpy as np
import torch

from hetbench.config import RunConfig
from hetbench.workload import KeyedDropout, load_workload
from hetbench.workloads.shapes_resnet import SHAPES, draw


def test_the_drawn_images_are_a_fixed_dataset_of_ten_distinct_shapes():
    images, labels = draw(400, seed=7)
    again, _ = draw(400, seed=7)
    assert images.dtype == np.uint8 and images.shape == (400, 3, 32, 32)
    assert np.array_equal(images, again)  # every machine draws the same images
    assert not np.array_equal(images, draw(400, seed=8)[0])
    assert sorted(set(labels.tolist())) == list(range(len(SHAPES)))
    # each class's mean silhouette differs from every other's: the labels are learnable
    ink = (images.astype(np.float32).mean(1) > 120).astype(np.float32)
    means = np.stack([ink[labels == c].mean(0) for c in range(len(SHAPES))])
    gaps = np.abs(means[:, None] - means[None]).mean((2, 3)) + np.eye(len(SHAPES))
    assert gaps.min() > 0.005


def test_the_resnet_has_fewer_bytes_and_is_exact():
    loaded = load_workload(RunConfig(workload="shapes-resnet"))
    assert loaded.name == "shapes-resnet" and loaded.exact
    assert loaded.parameters == 308_650
    model = loaded.build_model(0)
    assert sum(isinstance(m, KeyedDropout) for m in model.modules()) == 1
    batch = loaded.prepare(torch.from_numpy(draw(4, 1)[0]))
    assert batch.dtype == torch.float32 and model.eval()(batch).shape == (4, len(SHAPES))
