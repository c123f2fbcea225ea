"""course_utils.performance.datasets: the made-up datasets of notebook 07's input pipeline, DecodedImages
(deterministic images, made with some work) and SlowReads (a storage opened once per process, then read
slowly)."""

from __future__ import annotations

import time

import pytest
import torch

from course_utils.performance.datasets import DecodedImages, SlowReads


def test_decoded_images_are_deterministic_and_checked() -> None:
    data = DecodedImages(n=4, size=16, classes=3, work=1)
    image, label = data[2]
    assert image.shape == (3, 16, 16) and label == 2
    assert torch.equal(image, data[2][0]) and abs(image.mean().item()) < 1e-5
    with pytest.raises(IndexError):
        data[4]
    with pytest.raises(ValueError, match="at least 1"):
        DecodedImages(n=0)


def test_slow_reads() -> None:
    data = SlowReads(n=3, read_ms=0, features=2)
    assert len(data) == 3 and torch.equal(data[2][0], torch.full((2,), 2.0)) and data[2][1] == 2
    with pytest.raises(IndexError):
        data[3]
    with pytest.raises(ValueError, match="at least"):
        SlowReads(n=0)
    with pytest.raises(ValueError, match="open_ms"):
        SlowReads(open_ms=-1)


def test_slow_reads_opens_once_per_process() -> None:
    data = SlowReads(n=4, read_ms=0, open_ms=400)
    t0 = time.perf_counter()
    data[0]
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    data[1], data[2]
    assert first >= 0.4 and time.perf_counter() - t0 < 0.4  # opened once: the later reads do not wait for it
    data._opened_in = -1  # as in a worker process, whose copy was made in another one: it opens again
    t0 = time.perf_counter()
    data[3]
    assert time.perf_counter() - t0 >= 0.4
