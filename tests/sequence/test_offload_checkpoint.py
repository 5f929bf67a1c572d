"""Activation checkpointing with host-held checkpoints equals plain non-reentrant checkpointing bit for bit."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from superoffload.device import HazardError
from superoffload.models import get_shape
from superoffload.models.gpt import GPT
from superoffload.models.hf import build_hf
from superoffload.sequence import ActivationOffloader, enable_offloaded_checkpointing

BATCH, SEQ = 2, 64


def _build(name: str, ac, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    shape = get_shape(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # transformers' deprecated checkpointing alias
        offload = ac == "offload"   # host-memory checkpoints are switched on after the build
        ac = False if offload else ac
        if shape.family == "gpt":
            model = GPT(shape, max_seq=SEQ, activation_checkpointing=ac)
        else:
            model = build_hf(shape, activation_checkpointing=ac)
        if offload:
            enable_offloaded_checkpointing(model)
    return model.to(device).train()


def _step(model: torch.nn.Module, device: str = "cpu"):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 1024, (BATCH, SEQ), generator=g).to(device)
    y = torch.randint(0, 1024, (BATCH, SEQ), generator=g).to(device)
    loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_offloaded_equals_plain_checkpointing(name: str) -> None:
    loss0, grads0 = _step(_build(name, True))
    model = _build(name, "offload")
    loss1, grads1 = _step(model)
    assert torch.equal(loss1, loss0)
    assert grads1.keys() == grads0.keys()
    for n in grads0:
        assert torch.equal(grads1[n], grads0[n]), n
    # the block inputs were held on the host: one [batch, seq, hidden] fp32 tensor per layer
    shape = get_shape(name)
    st = model.activation_offloader.stats()
    assert st.offloaded == shape.layers
    assert st.peak_host_bytes == shape.layers * BATCH * SEQ * shape.hidden * 4
    # backward fetched the last block's input on demand and prefetched every other one a block ahead
    assert (st.fetched_on_demand, st.prefetched) == (1, shape.layers - 1)
    gc.collect()
    assert model.activation_offloader.stats().host_bytes == 0


def test_only_the_block_input_is_offloaded() -> None:
    """Inside the checkpoint its own hooks take every saved tensor; ours see the inputs only."""
    block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    x = torch.randn(4, 16, requires_grad=True)
    offloader = ActivationOffloader()
    packed = []
    pack = offloader._pack
    offloader._pack = lambda t: packed.append(t.shape) or pack(t)
    y = offloader.checkpoint(block, x * 2)
    assert packed == [torch.Size([4, 16])]
    y.sum().backward()
    g_off = x.grad.clone()
    x.grad = None
    checkpoint(block, x * 2, use_reentrant=False).sum().backward()
    assert torch.equal(g_off, x.grad)


def test_no_offload_without_grad() -> None:
    model = _build("gpt-tiny", "offload")
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long))
    model.eval()
    model(torch.zeros(1, 8, dtype=torch.long))
    assert model.activation_offloader.stats().offloaded == 0


def test_offloader_survives_deepcopy() -> None:
    import copy

    model = copy.deepcopy(_build("gpt-tiny", "offload"))
    _step(model)
    assert model.activation_offloader.stats().offloaded == get_shape("gpt-tiny").layers


def _sim_step(name: str, disabled: tuple[str, ...] = ()):
    """One step of the offloaded model with its copies on the simulated discrete device, under its checks."""
    from superoffload.device.sim import SimDevice

    dev = SimDevice()
    dev.disabled_points |= set(disabled)
    model = _build(name, "offload")
    model.activation_offloader.use_device(dev)
    with dev.tracking():
        return dev, model, _step(model)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_sim_offloaded_equals_plain_checkpointing(name: str) -> None:
    """The discrete path (pinned host copies, side-stream copies, events, device buffers for the prefetched
    inputs) on the simulated device: bit-identical, every read ordered, every buffer in the ledger."""
    loss0, grads0 = _step(_build(name, True))
    dev, model, (loss1, grads1) = _sim_step(name)
    assert torch.equal(loss1, loss0)
    for n in grads0:
        assert torch.equal(grads1[n], grads0[n]), n
    assert dev.hb.hazards == []
    assert {"checkpoint: block input written", "checkpoint: copy to host", "checkpoint: prefetch buffer free",
            "checkpoint: copy to device", "checkpoint: prefetched input landed"} <= dev.points_seen
    shape = get_shape(name)
    st = model.activation_offloader.stats()
    assert (st.fetched_on_demand, st.prefetched) == (1, shape.layers - 1)
    per_block = BATCH * SEQ * shape.hidden * 4
    # the prefetched inputs were device memory: at most the planner's window of two block inputs at once
    assert dev.ledger.peak_by_category["activations"] >= per_block
    del loss1, grads1
    model.zero_grad(set_to_none=True)
    gc.collect()
    rep = dev.memory_report()   # every host copy and device buffer freed, and the ledger says so
    assert rep["host_by_category"].get("activation_checkpoints", 0) == 0
    assert rep["host_needed_bytes"]["pinned"] == 0 and rep["device_live"]["activations"] == 0


def test_sim_host_copies_are_pinned_and_counted() -> None:
    from superoffload.device.sim import SimDevice

    dev = SimDevice()
    model = _build("gpt-tiny", "offload")
    model.activation_offloader.use_device(dev)
    x = torch.zeros(BATCH, SEQ, dtype=torch.long)
    with dev.tracking():
        loss = model(x, x)
    shape = get_shape("gpt-tiny")
    held = shape.layers * BATCH * SEQ * shape.hidden * 4
    assert dev.memory_report()["host_by_category"]["activation_checkpoints"] == held
    assert dev.memory_report()["host_needed_bytes"]["pinned"] == held
    with dev.tracking():
        loss.backward()


@pytest.mark.parametrize("point", ["checkpoint: prefetched input landed", "checkpoint: prefetch buffer free"])
def test_sim_reports_a_missing_ordering_point(point: str) -> None:
    """Each ordering point of the copy back is needed: without it the simulator reports the hazard (the
    recompute reading the input before its copy lands; the copy writing a buffer the compute stream has
    just been handed). The copy to the host reads the model's activation, which the simulator does not
    track, so its point ("block input written") is not checked here."""
    with pytest.raises(HazardError):
        _sim_step("gpt-tiny", disabled=(point,))


class _SavesAPlaceholder(torch.autograd.Function):
    """What torch.utils.checkpoint before 2.13 saves per block (seen on torch 2.11, CUDA): a zero-element
    placeholder beside the block's input, both through the outer saved-tensor hooks."""

    @staticmethod
    def forward(ctx, placeholder: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(placeholder, x)
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        placeholder, x = ctx.saved_tensors
        assert placeholder.numel() == 0 and x.shape == grad.shape
        return None, grad * 2


def test_zero_element_placeholders_are_not_offloaded_nor_links_of_the_prefetch_chain() -> None:
    off = ActivationOffloader()
    x = torch.randn(4, 8, requires_grad=True)
    y = x
    with torch.autograd.graph.saved_tensors_hooks(off._pack, off._unpack):
        for _ in range(3):
            y = _SavesAPlaceholder.apply(torch.empty(0, requires_grad=True), y)
    y.sum().backward()
    st = off.stats()
    assert st.offloaded == 3   # the inputs only
    assert (st.fetched_on_demand, st.prefetched) == (1, 2)   # each input fetched one block ahead but the last
    assert torch.equal(x.grad, torch.full_like(x, 8.0))


@pytest.mark.cuda
def test_cuda_offloaded_equals_plain_checkpointing() -> None:
    """The CUDA path: pinned host buffers, side-stream copies, events, prefetch one block ahead."""
    loss0, grads0 = _step(_build("gpt-tiny", True, "cuda"), "cuda")
    model = _build("gpt-tiny", "offload", "cuda")
    loss1, grads1 = _step(model, "cuda")
    torch.cuda.synchronize()
    assert torch.equal(loss1, loss0)
    for n in grads0:
        assert torch.equal(grads1[n], grads0[n]), n
    st = model.activation_offloader.stats()
    assert (st.fetched_on_demand, st.prefetched) == (1, get_shape("gpt-tiny").layers - 1)
