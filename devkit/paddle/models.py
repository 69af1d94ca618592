"""Small Paddle networks that devkit's paddle suite and ``devkit-bench paddle`` train on a place."""

from __future__ import annotations

import numpy as np


def cnn(paddle):
    """Conv2D-BatchNorm2D-ReLU-Conv2D-ReLU-Flatten-Linear-LayerNorm over (N, 2, 8, 8) inputs, 5 classes."""
    nn = paddle.nn
    return nn.Sequential(nn.Conv2D(2, 4, 3, padding=1), nn.BatchNorm2D(4), nn.ReLU(), nn.Conv2D(4, 4, 3, stride=2),
                         nn.ReLU(), nn.Flatten(), nn.Linear(36, 5), nn.LayerNorm(5))


CNN_INPUT = (8, 2, 8, 8)
CNN_CLASSES = 5


def training_step(paddle, net, optimizer, x_shape, classes: int, seed: int = 20):
    """A step function (forward, CrossEntropyLoss, backward, optimizer step) on fixed data; it returns the loss."""
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal(x_shape).astype(np.float32))
    y = paddle.to_tensor(rng.integers(0, classes, (x_shape[0], 1)).astype(np.int64))
    loss_fn = paddle.nn.CrossEntropyLoss()

    def step():
        loss = loss_fn(net(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        return loss
    return step
