"""``compressor=signsgd`` and ``compressor=signum``: sign compression with majority vote.

Bernstein, Zhao, Azizzadenesheli, Anandkumar, "signSGD with Majority Vote is Communication
Efficient and Fault Tolerant" (ICLR 2019), Algorithm 1 (Signum with majority vote; momentum 0
is signSGD with majority vote, Bernstein et al., ICML 2018)::

    v = (1 - beta) g + beta v     Alg. 1: the worker's momentum (beta = ``momentum``)
    send sign(v)                  Alg. 1: one bit per element (sign(0) = +1 here)
    V = sum_w sign(v_w)           Alg. 1: the vote
    out = sign(V)                 Alg. 1: the vote's sign (0 on a tie, with an even W)

The update x = x - eta (sign(V) + lambda x) of Alg. 1 is the optimizer's: SGD with momentum 0
and weight decay lambda, at a learning rate for sign updates (the zoo sweep sets both).

The exchange. The paper's server gets one bit per element from each worker and sends the vote's
sign back, one more bit down. We have no server: an all-gather of the bit-packed signs, every
worker counting the vote itself (it receives W bits per element). ``bits`` and ``wire_bits``
both count the n bits a worker sends (up); an all-reduce of int8 signs instead would send 8 n.
No levels: there is nothing for Accordion to switch. On the CPU a C kernel packs the signs and
counts the vote (:mod:`compression._sign_kernel`: the same bits as the torch ops here).
"""

from __future__ import annotations

import math

import torch

from compression import _sign_kernel as _kernel
from compression import register
from compression.base import Layer
from compression.exchange import GatherCompressor, pack_bits, unpack_bits
from compression.memory import ErrorFeedback
from core.errors import check_number


@register("signsgd")
class SignSGD(GatherCompressor):
    """Majority vote of the workers' signs of their (momentum of the) gradient."""

    paper = "Bernstein et al., ICML 2018 / ICLR 2019"
    wire = "all-gather: 1 sign bit per element; every worker counts the vote"

    def __init__(self, momentum: float = 0.0) -> None:
        super().__init__()
        self.momentum = check_number(momentum, "compressor.momentum", 0, 1, high_open=True)
        self._v = ErrorFeedback(key="momentum")  # v: the worker's momentum (Signum)

    def step_bits(self, shape: torch.Size, level: object) -> int:
        return math.prod(shape)

    def message_size(self, layer: Layer, numel: int) -> int:
        return math.ceil(numel / 8)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        v = grad
        if self.momentum:                                   # v = (1 - beta) g + beta v
            v = self._v.buffer(layer, grad.numel(), grad).mul_(self.momentum)
            v.add_(grad, alpha=1 - self.momentum)
        lib = _kernel.kernel(v, message)                    # the same bits, in C
        if lib is not None:
            _kernel.pack(lib, v, message)
        else:
            message[:] = pack_bits(v < 0)                   # sign(v)
        return grad.numel()

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        lib = _kernel.kernel(out, *parts)
        if lib is not None:                                 # sign(V), in C
            _kernel.vote(lib, out, parts)
            return
        votes = torch.zeros(out.numel(), dtype=torch.int32, device=out.device)
        for part in parts:                                  # V = sum_w sign(v_w)
            votes += 1 - 2 * unpack_bits(part, out.numel()).int()
        torch.sign(votes, out=votes)
        out.copy_(votes)                                    # sign(V)


@register("signum")
class Signum(SignSGD):
    """SignSGD with the worker's momentum, beta = 0.9 (the paper's)."""

    def __init__(self, momentum: float = 0.9) -> None:
        super().__init__(momentum)
