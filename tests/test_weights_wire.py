"""A policy version on the wire (weights/checksum.py's WireStateDict): pickled with protocol 5,
as Ray pickles what it stores, every tensor's bytes leave the pickle as out-of-band buffers
(what lets Ray write them into its object store once and read them from shared memory), and
what comes back is the same tensors, bit for bit, writable."""

import pickle

import torch

from grpo_dist.weights.checksum import export_state_dict, state_checksum


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(7, 5, generator=generator),
        "bf16.weight": torch.randn(3, 4, generator=generator).to(torch.bfloat16),
        "fp16.bias": torch.randn(6, generator=generator).to(torch.float16),
        "transposed": torch.randn(4, 3, generator=generator).t(),  # not contiguous
        "positions": torch.arange(5, dtype=torch.int64),  # a buffer
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }


def test_every_tensor_travels_out_of_band_and_comes_back_bit_for_bit():
    original = tensors()
    exported = export_state_dict(original)
    buffers: list[pickle.PickleBuffer] = []
    in_band = pickle.dumps(exported, protocol=5, buffer_callback=buffers.append)
    payload = sum(t.numel() * t.element_size() for t in original.values())
    assert sum(len(b.raw()) for b in buffers) == payload
    assert len(in_band) < 1000  # names, dtypes and shapes only (the payload is 412 bytes here)
    back = pickle.loads(in_band, buffers=buffers)
    assert list(back) == list(original)
    for name, tensor in original.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name
    assert state_checksum(back) == state_checksum(original)
    back["embed.weight"].add_(1)  # its own memory: the store's copy stays as it was
    assert torch.equal(pickle.loads(in_band, buffers=buffers)["embed.weight"], original["embed.weight"])


def test_plain_pickling_works_too():
    """Without a buffer callback (a checkpoint, a copy) the bytes go in band, and still come back."""
    back = pickle.loads(pickle.dumps(export_state_dict(tensors())))
    assert state_checksum(back) == state_checksum(tensors())
