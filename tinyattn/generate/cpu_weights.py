"""Linear weights stored in oneDNN's blocked layout, for a CPU model used only to generate.

At batch 1 each new token multiplies one vector by every weight matrix, and the product is
limited by how fast the matrix is read. aten's matmul reads the plain (out, in) weight at
every call; oneDNN reads a weight reordered once into its own layout faster on the CPUs we
measured, most of all in bf16 (docs/BENCHMARKS.md). The arithmetic is the same, so outputs
equal nn.Linear's up to float rounding.

One exception, measured in the decode loop itself: a single bf16 row (one sequence, one
token) goes through aten's own matrix-vector kernel (`matrix_vector`, or in the decoder's
one-token step `torch.mv` by `one_row_weight` under `aten_kernels`), which accumulates in
fp32 as oneDNN does. Timed alone, oneDNN's call is as fast or faster; between the other
operators of a decode step it is the slower one, and the whole step is faster with aten's
kernel (docs/BENCHMARKS.md, "One bf16 row through aten's kernel").

On a CPU without bf16 units, where generation runs in fp32, a step's products read every
fp32 weight, and that read is most of a token's time. There `pack_linear_weights(row_dtype=
torch.float16)` keeps an fp16 copy of each weight too, and a single row is rounded to fp16
and multiplied by it (`one_row_weight`; aten's kernel, which accumulates in fp32): half the
bytes to read, and a much faster step on an AVX2 CPU (docs/BENCHMARKS.md, "fp16 copies for
one-row steps"). Its outputs are fp32's up to fp16's rounding of the weight and the row
(finer than bf16's); products of more rows (a prefill's blocks, batches of sequences) stay fp32.
For one sequence a prefill's head is a one-row product too: the decoder asks for the last
position's logits only (`LanguageModel.next_token_logits`). Where
a product overflows fp16's range, the decoder drops the copies (`drop_row_weights`) and
decodes in fp32 from there (`generate.decoder.CachedDecoder`).

The risk, stated once: packing calls two private operators of PyTorch's oneDNN integration,
`torch.ops.mkldnn._reorder_linear_weight` and `torch.ops.mkldnn._linear_pointwise` (the ones
inductor's own CPU weight prepacking uses). They are not public API and may change or vanish
in any PyTorch release; nothing else in tinyattn calls them. `pack_linear_weights` therefore
tries them on a small matrix first and, where they are missing or fail, returns False and
leaves the model as it was: slower, never wrong.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    """weight (out, in) -> the same matrix in oneDNN's layout for batch-1 inputs (private op)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x (..., in) times a `_reorder`ed weight -> (..., out), no bias (private op)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


_ATEN_LOCK = threading.Lock()
_aten_blocks = 0  # `aten_kernels` blocks open, in any thread
_onednn_before = True  # the flag as the first of them found it


@contextmanager
def aten_kernels() -> Iterator[None]:
    """Inside the block, bf16 and fp16 matrix products run aten's own kernels, never oneDNN's.

    torch sends such a product to oneDNN wherever the CPU has instructions for the dtype; with
    oneDNN switched off (a process-wide flag) the same product of one row runs aten's
    matrix-vector kernel, which accumulates in fp32 as oneDNN does. The flag is switched off when
    the first block opens and back as it was when the last one closes, whichever threads open
    and close them. Meanwhile another thread's bf16 or fp16 matmuls run aten's kernels too:
    slower, and for more than one row rounded differently. Calls of the private packed operator
    (`_packed_linear`) are not affected.
    """
    global _aten_blocks, _onednn_before
    with _ATEN_LOCK:
        if _aten_blocks == 0:
            _onednn_before = torch._C._get_mkldnn_enabled()
            torch._C._set_mkldnn_enabled(False)
        _aten_blocks += 1
    try:
        yield
    finally:
        with _ATEN_LOCK:
            _aten_blocks -= 1
            if _aten_blocks == 0:
                torch._C._set_mkldnn_enabled(_onednn_before)


def matrix_vector(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., in) holding one row times weight (out, in) -> (..., out), through aten's own kernel
    (`aten_kernels`). For bf16 and fp16 weights; x is in the weight's dtype.

    `torch.mv` calls the kernel directly; `F.linear` reaches the same kernel (the same numbers)
    through four more dispatcher calls (linear, matmul, t, mm), which at 25 products a token cost
    a measurable part of a decode step (docs/BENCHMARKS.md, "torch.mv for the one-row products").
    """
    with aten_kernels():
        return torch.mv(weight, x.reshape(-1)).view(*x.shape[:-1], -1)


class PackingOperators(NamedTuple):
    """What packing calls: `reorder(weight (out, in))` once per layer, `linear(x, reordered)` per call."""

    reorder: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


ONEDNN = PackingOperators(_reorder, _packed_linear)  # the private operators of the module docstring


class PackedLinear(nn.Module):
    """A bias-free linear layer for CPU inference, its weight also stored in oneDNN's layout.

    The plain weight is kept: code being compiled (`torch.compile`, which cannot lower the
    private op) multiplies by it, and inductor generates its own matrix-vector kernels from
    it; eager calls use the packed copy, except a single row (`product`): a bf16 one through
    aten's kernel, and with `row_dtype` any one by a copy of the weight in that dtype
    (`row_weight`; the module docstring says why). Inference only: no autograd, and cast
    the model before packing it.
    """

    def __init__(self, weight: torch.Tensor, operators: PackingOperators = ONEDNN,
                 row_dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.operators = operators
        self.register_buffer("packed_weight", operators.reorder(weight.detach()), persistent=False)
        row_weight = None if row_dtype in (None, weight.dtype) else weight.detach().to(row_dtype)
        self.register_buffer("row_weight", row_weight, persistent=False)  # (out, in) or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return F.linear(x, self.weight)  # (..., out)
        if x.requires_grad:
            raise RuntimeError("PackedLinear is for inference only; run it under torch.inference_mode()")
        return self.product(x)  # (..., out)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out), eagerly: one row by `matrix_vector` (by `one_row_weight`, where
        there is one), anything else by oneDNN."""
        if x.numel() == self.in_features and (weight := one_row_weight(self)) is not None:
            return matrix_vector(x.to(weight.dtype), weight).to(x.dtype)
        return self.operators.linear(x, self.packed_weight)


def one_row_weight(module: nn.Module) -> Optional[torch.Tensor]:
    """The weight a packed layer multiplies a single row by through aten's kernel (`matrix_vector`):
    its copy for one-row products (`row_dtype`), else a bf16 layer's own weight; None where one row
    goes through oneDNN as more rows do (fp32 without a copy), or the layer is not packed."""
    if not isinstance(module, PackedLinear):
        return None
    if module.row_weight is not None:
        return module.row_weight
    return module.weight if module.weight.dtype == torch.bfloat16 else None


def pack_linear_weights(model: nn.Module, operators: PackingOperators = ONEDNN,
                        row_dtype: Optional[torch.dtype] = None) -> bool:
    """Swap each bias-free nn.Linear of a CPU model for a `PackedLinear`, in place.

    For a model loaded only to generate (measured gains: docs/BENCHMARKS.md). A tied output
    head gets its own packed copy (the embedding keeps the original). row_dtype: also keep a
    copy of each weight in this dtype for one-row products (torch.float16 beside the weights of
    an fp32 model, the only pairing allowed: the module docstring; None: none). Returns False, leaving
    the model unchanged, where the model is not on the CPU, oneDNN is not available, or the
    private operators (see the module docstring) are missing or fail a trial on a small matrix.
    `operators` replaces them (a test gives ones that are missing or fail).
    """
    weight = next(model.parameters())
    if row_dtype not in (None, weight.dtype) and weight.dtype != torch.float32:
        raise ValueError(f"row_dtype {row_dtype} copies are kept beside fp32 weights only; this model's "
                         f"are {weight.dtype}")
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not _packing_works(weight.dtype, operators):
        return False
    replacements = [(parent, name, PackedLinear(child.weight, operators, row_dtype))
                    for parent in model.modules() for name, child in parent.named_children()
                    if isinstance(child, nn.Linear) and child.bias is None]
    for parent, name, packed in replacements:
        setattr(parent, name, packed)
    return True


def has_row_weights(model: nn.Module) -> bool:
    """Whether any layer of the model multiplies one row by a copy of its weight (`row_dtype`)."""
    return any(isinstance(m, PackedLinear) and m.row_weight is not None for m in model.modules())


def drop_row_weights(model: nn.Module) -> None:
    """Forget every layer's row copy, in place: one rows multiply by the weights as packed from now on."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.row_weight = None


def _packing_works(dtype: torch.dtype, operators: PackingOperators) -> bool:
    """Whether this torch build packs and multiplies a small matrix of `dtype` correctly."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(8, 16, generator=generator).to(dtype)
    x = torch.randn(1, 16, generator=generator).to(dtype)
    try:
        with torch.inference_mode():
            product = operators.linear(x, operators.reorder(weight))
    except (AttributeError, RuntimeError, NotImplementedError):  # op missing, or refused
        return False
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    return torch.allclose(product.float(), F.linear(x, weight).float(), rtol=tolerance, atol=tolerance)
