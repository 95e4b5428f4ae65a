"""benchmarks/bench_step_profile.py: its pure pieces at tiny sizes -- the FLOP count of a
convolution equals the closed form 2 * B * C_in * C_out * k^2 * H_out * W_out (and the count of
a step includes the backward, about twice the forward), the phase table's shares sum to one,
and the demo's multi-crop batch has the recipe's shapes (read from the demo config).  No process
is started, nothing is timed."""
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from testkit import load_script


def _module():
    return load_script("benchmarks/bench_step_profile.py")


@pytest.mark.parametrize("b,cin,cout,k,size,stride,pad", [
    (1, 3, 16, 3, 28, 1, 1), (4, 16, 32, 3, 16, 2, 1), (2, 8, 8, 1, 7, 1, 0), (3, 5, 7, 5, 12, 1, 2)])
def test_conv_flops_closed_form_equals_torch_counter(b, cin, cout, k, size, stride, pad):
    mod = _module()
    conv = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=False)
    x = torch.randn(b, cin, size, size)
    with FlopCounterMode(display=False) as counter:
        y = conv(x)
    h, w = y.shape[-2:]
    assert mod.conv2d_flops(b, cin, cout, k, h, w) == counter.get_total_flops()
    # by hand: every output element is a dot product of cin * k * k multiply-adds
    assert mod.conv2d_flops(b, cin, cout, k, h, w) == 2 * y.numel() * cin * k * k


def test_step_count_includes_backward_of_a_conv_net():
    mod = _module()
    torch.manual_seed(0)
    model = mod.build_model(channels_last=True, width=4, prototypes=10)
    loss = mod.build_loss()
    loss.num_prototypes = [10]
    crops = [torch.randn(2, 3, 28, 28)] * 2 + [torch.randn(2, 3, 16, 16)] * 4
    fwd, bwd, fv = mod.count_flops(model, loss, crops)
    # the stem alone: 3 -> 4 channels, 3x3, stride 1 on every crop
    stem = sum(mod.conv2d_flops(c.shape[0], 3, 4, 3, c.shape[-2], c.shape[-1]) for c in crops)
    assert fwd > stem
    # backward of a conv net: input and weight gradients ~ 2x the forward (the stem's input
    # gradient is not needed, so a little under)
    assert 1.5 * fwd < bwd < 2.1 * fwd
    if fv is not None:  # fvcore counts a multiply-add as one
        assert math.isclose(2 * fv, fwd, rel_tol=0.1)


@pytest.mark.parametrize("phases", [
    {"a": 1.0, "b": 3.0}, {"data": 31.2, "forward": 79.4, "backward": 135.7, "x": 0.0},
    {"only": 5.0}])
def test_phase_table_shares_sum_to_one(phases):
    mod = _module()
    rows, total = mod.phase_table(phases)
    assert [r[0] for r in rows] == list(phases)
    assert total == pytest.approx(sum(phases.values()))
    assert sum(r[2] for r in rows) == pytest.approx(1.0)
    assert sum(r[1] for r in rows) == pytest.approx(total)
    text = mod.format_table(rows, total)
    assert all(name in text for name in phases) and "total" in text


def test_phase_table_of_nothing_is_zero_not_an_error():
    rows, total = _module().phase_table({"a": 0.0})
    assert total == 0.0 and rows == [("a", 0.0, 0.0)]


def test_demo_batch_has_the_recipe_crops():
    mod = _module()
    batch = mod.make_batch(mod.build_transform(), mod.random_images(3))
    assert [tuple(c.shape) for c in batch] == [(3, 3, 28, 28)] * 2 + [(3, 3, 16, 16)] * 4
    assert all(c.dtype == torch.float32 for c in batch)


@pytest.mark.parametrize("flags,expected", [
    ("fpu avx512f avx512_bf16", True), ("fpu amx_tile amx_bf16", True), ("fpu avx2 avx512f", False),
    ("", False)])
def test_bf16_variants_run_where_the_flags_line_has_native_bf16(flags, expected):
    cpuinfo = "".join(f"processor\t: {i}\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n" for i in range(2))
    assert _module().native_bf16(cpuinfo) is expected
