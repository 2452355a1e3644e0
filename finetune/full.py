"""Full fine-tuning: which of GLM-5's parameters train, and the router's bias by its own rule.

    named = prepare_full(model, FullSettings())       # requires_grad set; -> what the loop trains and saves

By default everything trains except:
- the MTP layer (`model.layers.{num_hidden_layers}.*`): it drafts for whatever the main model becomes, and
  `glm5 finetune align-mtp` re-aligns it to the fine-tuned model afterwards (train_mtp=True trains it with the
  rest; it gets gradient only from an MTP term, which SFT adds with SFTConfig.mtp_steps, `--train-mtp`);
- the DSA indexer (`*.indexer.*`): its top-k selection is indices, through which the LM loss sends no gradient
  (the model runs it without autograd), so training it by this loss would only decay it; GLM-5 trains it by its
  own KL to dense attention (DeepSeek-V3.2's warm-up), not by SFT.
- the router's `e_score_correction_bias`, a buffer that only steers which experts are picked: no gradient
  reaches it. With `router_bias_rate` > 0 it follows DeepSeek-V3's auxiliary-loss-free balancing rule after
  every step, bias_e += rate * sign(mean load - load_e), counted over the step's tokens (GLM-5 keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as td

from model.moe import Router


@dataclass(frozen=True)
class FullSettings:
    train_mtp: bool = False
    router_bias_rate: float = 0.0  # 0: frozen; DeepSeek-V3 used 1e-3 in pre-training


def prepare_full(model, s: FullSettings = FullSettings()) -> list[tuple[str, torch.Tensor]]:
    """Set requires_grad for full fine-tuning. -> the trained parameters by name, plus the router biases when
    they are updated (so the loop's checkpoints save and restore them too)."""
    mtp = f"model.layers.{model.config.num_hidden_layers}."
    named = []
    for n, p in model.named_parameters():
        train = ".indexer." not in n and (s.train_mtp or not n.startswith(mtp))
        p.requires_grad_(train)
        if train:
            named.append((n, p))
    if s.router_bias_rate > 0:
        named += [(n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
    return named


class RouterBalancer:
    """Counts each router's expert loads during training forwards; `update()` applies the balancing rule and
    starts the next count. Hooks removed by `close()`. `distributed`: the loads are summed over the ranks
    (which count their own padding, and an empty micro-batch's two tokens: finetune/distributed.py; a batch split
    over ranks pads less, so the counts, and where loads tie the rule's sign, can differ from one process's)."""

    def __init__(self, model, rate: float, distributed: bool = False):
        self.rate, self.distributed = rate, distributed
        self.loads: dict[Router, torch.Tensor] = {}
        self.hooks = [m.register_forward_hook(self._count) for m in model.modules() if isinstance(m, Router)]

    def _count(self, router, _inputs, output) -> None:
        if not router.training:
            return
        idx = output[1].detach().flatten()
        n = router.e_score_correction_bias.numel()
        self.loads[router] = (
            self.loads.get(router, torch.zeros(n, device=idx.device)) + torch.bincount(idx, minlength=n).float()
        )

    @torch.no_grad()
    def update(self) -> None:
        if self.distributed:  # each rank counted its own rows: the rule takes the whole batch's loads
            for load in self.loads.values():
                td.all_reduce(load)
        for router, load in self.loads.items():
            router.e_score_correction_bias.add_(self.rate * torch.sign(load.mean() - load))
        self.loads = {}

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
