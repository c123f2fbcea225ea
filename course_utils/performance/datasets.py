"""Notebooks 07 and 09: data sets for measuring an input pipeline.

`SlowReads` stands for files on slow storage: each item costs time spent waiting, not computing, so
worker processes overlap the waits even on a machine with few cores. Each process also opens the storage
once (``open_ms``) before its first read, as a real data set opens its files or connections in every worker.


`DecodedImages` stands for a folder of JPEGs: each item is "decoded" (an image drawn from the item's
seed), then augmented (a random crop resized back, a flip) and normalised, all on the CPU, as a
torchvision transform pipeline would. It lives in a module, not in the notebook, because ``DataLoader``
workers started with *spawn* (macOS, Windows, and CUDA-safe setups) import the data set's class: a class
defined in a notebook cell cannot be found by them.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

__all__ = ["DecodedImages", "SlowReads"]


class DecodedImages(Dataset[tuple[torch.Tensor, int]]):
    """``n`` items of ``(image, label)``: a float ``(3, size, size)`` image and a label in ``[0, classes)``.

    ``work`` scales the CPU cost of one item (how many augmentation passes it takes); item ``i`` is the
    same in every process and on every run."""

    def __init__(self, n: int = 512, size: int = 64, classes: int = 10, work: int = 4) -> None:
        if min(n, size, classes, work) < 1:
            raise ValueError(f"DecodedImages: n, size, classes and work must be at least 1, got "
                             f"n={n}, size={size}, classes={classes}, work={work}")
        self.n, self.size, self.classes, self.work = n, size, classes, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"item {i} of a data set of {self.n}")
        g = torch.Generator().manual_seed(i)
        raw = torch.randint(0, 256, (3, self.size + 16, self.size + 16), dtype=torch.uint8, generator=g)
        image = raw.float().unsqueeze(0)
        for _ in range(self.work):  # augmentation passes: crop, resize back, maybe flip, blur a little
            top, left = torch.randint(0, 17, (2,), generator=g).tolist()
            crop = image[..., top:top + self.size, left:left + self.size]
            image = F.interpolate(crop, size=(self.size + 16, self.size + 16), mode="bilinear",
                                  align_corners=False)
            if torch.rand((), generator=g) < 0.5:
                image = image.flip(-1)
            image = F.avg_pool2d(image, 3, stride=1, padding=1)
        image = image[..., 8:8 + self.size, 8:8 + self.size].squeeze(0)
        image = (image - image.mean()) / (image.std() + 1e-5)
        return image, i % self.classes


class SlowReads(Dataset[tuple[torch.Tensor, int]]):
    """``n`` small items ``(features, label)``, each taking ``read_ms`` milliseconds to "read": the process
    sleeps, as it would while waiting for a disk or a network, and uses no CPU meanwhile. The first read in
    each process first waits ``open_ms`` (opening the storage): a ``DataLoader`` worker pays it once in its
    life, so workers started again at every epoch pay it at every epoch."""

    def __init__(self, n: int = 512, read_ms: float = 2.0, features: int = 8, open_ms: float = 0.0) -> None:
        if n < 1 or features < 1 or read_ms < 0 or open_ms < 0:
            raise ValueError(f"SlowReads: n and features must be at least 1, read_ms and open_ms at least 0, got "
                             f"n={n}, read_ms={read_ms}, features={features}, open_ms={open_ms}")
        self.n, self.read_ms, self.features, self.open_ms = n, read_ms, features, open_ms
        self._opened_in: int | None = None  # the process that has opened the storage

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"item {i} of a data set of {self.n}")
        if self._opened_in != os.getpid():  # a worker holds a copy made before it started: it opens its own
            time.sleep(self.open_ms / 1e3)
            self._opened_in = os.getpid()
        time.sleep(self.read_ms / 1e3)
        return torch.full((self.features,), float(i)), i % 10
