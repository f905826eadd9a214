"""Small uploads reach the device unchanged, and on a GPU without waiting for the work queued there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qace.engine.pinned_upload import to_device


def test_values_arrive_unchanged() -> None:
    array = np.arange(10, dtype=np.int64)[::2]  # not contiguous
    np.testing.assert_array_equal(to_device(array, torch.device("cpu")).numpy(), array)


@pytest.mark.gpu
def test_the_host_does_not_wait_for_queued_work() -> None:
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time queued
    busy = torch.cuda.current_stream().record_event()
    uploaded = to_device(np.arange(1000, dtype=np.int64), device)
    assert not busy.query(), "the upload waited for the queued kernel"
    assert uploaded.sum().item() == 499_500  # and it arrives, in order after that kernel
    torch.testing.assert_close(uploaded.cpu(), torch.arange(1000))
