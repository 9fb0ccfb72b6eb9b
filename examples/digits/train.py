"""Train the digits CNN that Kiln's int8 tests and docs measure accuracy on.

    pip install scikit-learn        # the digits data set ships inside it (1,797 8x8 images)
    python examples/digits/train.py

Writes, next to this script, ``digits_cnn.onnx`` (the trained float model, input ``x: f32[N,1,8,8]``,
output ``logits: f32[N,10]``; a symbolic batch) and ``digits_data.npz``: ``calib`` (200 training
images, for calibration), ``test_x`` / ``test_y`` (the 360 held-out images and labels). The split and
the training are seeded, so a rerun writes the same files on the same software.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from sklearn.datasets import load_digits

HERE = os.path.dirname(os.path.abspath(__file__))


class DigitsCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64 * 2 * 2, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))


def main() -> None:
    torch.manual_seed(0)
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None]  # [1797, 1, 8, 8] in [0, 1]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:360], order[360:]
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x[train]), torch.from_numpy(y[train])
    for epoch in range(30):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x[test])).argmax(1).numpy() == y[test]).mean()
    print(f"held-out accuracy (PyTorch, float): {acc:.4f}")
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), os.path.join(HERE, "digits_cnn.onnx"), input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, opset_version=17,
                      dynamo=False)
    np.savez_compressed(os.path.join(HERE, "digits_data.npz"), calib=x[train[:200]], test_x=x[test], test_y=y[test])


if __name__ == "__main__":
    main()
