"""Uploads reach the device unchanged, and on a GPU without waiting for the work queued there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qace.engine.pinned_upload import stack_to_device, to_device


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


def test_stacked_arrays_arrive_as_float32() -> None:
    arrays = [np.full((3, 4), i, dtype=dtype) for i, dtype in enumerate((np.float16, np.float64, np.float32))]
    stacked = stack_to_device(arrays, torch.device("cpu"))
    assert stacked.dtype == torch.float32 and stacked.shape == (3, 3, 4)
    np.testing.assert_array_equal(stacked.numpy(), np.stack(arrays).astype(np.float32))
    with pytest.raises(ValueError, match="nothing to stack"):
        stack_to_device([], torch.device("cpu"))
    with pytest.raises(ValueError):  # arrays of different shapes, as np.stack
        stack_to_device([np.zeros((3, 4)), np.zeros((3, 5))], torch.device("cpu"))


@pytest.mark.gpu
def test_stacked_upload_does_not_wait_and_arrives_unchanged() -> None:
    device = torch.device("cuda")
    arrays = [np.random.default_rng(i).random((36, 2054), dtype=np.float32) for i in range(64)]
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)
    busy = torch.cuda.current_stream().record_event()
    uploaded = stack_to_device(arrays, device)
    assert not busy.query(), "the upload waited for the queued kernel"
    np.testing.assert_array_equal(uploaded.cpu().numpy(), np.stack(arrays))
    again = stack_to_device(arrays[::-1], device)  # a second upload of the same size reuses pinned memory
    np.testing.assert_array_equal(again.cpu().numpy(), np.stack(arrays[::-1]))
    np.testing.assert_array_equal(uploaded.cpu().numpy(), np.stack(arrays))  # the first is unchanged
