"""The key/value cache used when generating one token at a time.

Keys and values of positions already processed never change (the causal mask keeps
them from seeing later tokens), so decoding stores them instead of recomputing them.
The cache is preallocated (for the positions a generation reaches, the whole context at most), and
the caller owns the position.

`KVCache` holds one layer's buffers and has two ways to write:

- `update(start_pos, k, v)` writes the new entries at start_pos and returns every entry
  up to the end of what was just written: the keys attention needs, no more.
- `write(positions, k, v)` writes them at the positions held in a tensor and returns the
  whole buffers. Nothing about the shapes depends on the position, so a decode step
  compiled once (`torch.compile`, CUDA graphs) serves every token; a mask hides the
  slots not yet written.

Attention sees neither: one forward pass wraps each layer's cache in a `CacheWrite`
(`cache_writes`), which knows where this pass's tokens go, and attention calls its one
method, `store(k, v)`, for the keys and values to attend over and, on the static path,
the mask that goes with them.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class KVCache:
    """Preallocated keys and values of one attention layer: (B, Hkv, max_len, D) each."""

    def __init__(self, batch_size: int, n_kv_head: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.keys.size(2)

    def update(self, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, Hkv, T, D) at positions start_pos..start_pos+T-1.

        Returns views of the keys and values at positions 0..start_pos+T-1, shape
        (B, Hkv, start_pos+T, D). Entries past that are ignored, so resetting the
        cache only means starting again at position 0.
        """
        end = start_pos + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked to write up to {end}")
        self.keys[:, :, start_pos:end] = k
        self.values[:, :, start_pos:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, Hkv, T, D) at `positions`, a (T,) int64 tensor on the cache's device.

        Returns the whole buffers, (B, Hkv, max_len, D), slots not yet written included:
        the caller masks every slot after a query's position. Positions are not checked
        against max_len, since reading them would stall the device at every token.
        """
        self.keys.index_copy_(2, positions, k)
        self.values.index_copy_(2, positions, v)
        return self.keys, self.values


class CacheWrite(NamedTuple):
    """Where one forward pass's T tokens go in one layer's cache: what attention calls.

    positions None: at start_pos..start_pos+T-1 (`KVCache.update`). Otherwise a (T,)
    tensor of positions (`KVCache.write`) and `mask`, (T, max_len) bool, True on the
    slots each query may read: those up to its own position.
    """
    cache: KVCache
    start_pos: int = 0
    positions: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None

    def store(self, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Write k, v (B, Hkv, T, D); return the keys and values to attend over, (B, Hkv, Tk, D)
        each, and their mask: None means causal, the T queries being the last T of the Tk keys."""
        if self.positions is None:
            keys, values = self.cache.update(self.start_pos, k, v)  # Tk = start_pos + T
            return keys, values, None
        keys, values = self.cache.write(self.positions, k, v)  # Tk = max_len
        return keys, values, self.mask

    @property
    def dtype(self) -> torch.dtype:
        """What the cache stores keys and values in; attention computes in it too."""
        return self.cache.keys.dtype

    @property
    def reads_every_slot(self) -> bool:
        """True on the static path: attention reads the whole buffer, written or not.

        Attention then takes its explicit path: its two small matmuls, mask and softmax
        compile into a few fused loops, where the fused kernel stays one opaque call per
        layer, slower on the CPU for a single query.
        """
        return self.positions is not None


def cache_writes(caches: list[KVCache], *, start_pos: int = 0,
                 positions: Optional[torch.Tensor] = None) -> list[CacheWrite]:
    """One `CacheWrite` per layer for a forward pass at start_pos, or at a (T,) positions tensor.

    With positions, the mask is built once here and shared by every layer.
    """
    if positions is None:
        return [CacheWrite(cache, start_pos) for cache in caches]
    slots = torch.arange(caches[0].max_len, device=positions.device)  # (Tk,)
    mask = slots <= positions.unsqueeze(1)  # (T, Tk): causal, written slots only
    return [CacheWrite(cache, 0, positions, mask) for cache in caches]
