"""The weight push: after each optimizer step, the trainer's new weights reach the rollout server, which keeps
serving (no restart), and later calls report the new version.

- in-process, own copy (the asynchronous default): the trained tensors (LoRA's, or every trainable one) are
  copied into the engine's model between two engine steps;
- in-process, shared model (the synchronous run): the engine serves the trainer's model itself, so the push
  only tells it the weights changed (its version moves);
- over HTTP (`--rollout-url`): the LoRA adapter is written in peft's format to PUSH_DIR/v{version} and loaded
  with sglang's `/load_lora_adapter` under the version's own name (remote.HttpServer: between
  /pause_generation and /continue_generation; `glm5 serve` speaks the same), or, for full-weight training, the
  checkpoint is written there and loaded with `/update_weights_from_disk`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune.lora import save_adapter


class WeightPush:
    def __init__(self, server, model, shared: bool = False, push_dir: Path | None = None, lora: bool = True,
                 adapter_state=None):  # fmt: skip
        """`adapter_state()`: the adapter whole, for a model sharded over torchrun's ranks (finetune/rl/sharded.py)."""
        self.server, self.model, self.shared = server, model, shared
        self.push_dir, self.lora, self.adapter_state = push_dir, lora, adapter_state
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.pushes = 0
        self._last: Path | None = None  # the previous push's folder: the server has read it, it can go

    def push(self, version: int) -> int:
        """Send the trainer's weights (now at `version`) -> the version the server reports afterwards."""
        self.pushes += 1
        if hasattr(self.server, "update_tensors"):
            self.server.update_tensors(None if self.shared else {n: p.detach().clone() for n, p in self.named})
            self.server.set_version(version)
            return self.server.version
        path = (Path(self.push_dir) / f"v{version}").resolve()  # the server may run elsewhere (cwd)
        shutil.rmtree(path, ignore_errors=True)
        if self.lora and self.adapter_state is not None:  # the base was never whole here: no fingerprint
            save_adapter(self.model, path, fingerprint="-", state=self.adapter_state())
            served = self.server.load_lora_adapter("glm5-rl", str(path), version)
        elif self.lora:
            save_adapter(self.model, path)
            served = self.server.load_lora_adapter("glm5-rl", str(path), version)
        else:
            self.model.save_pretrained(path)
            served = self.server.update_weights_from_disk(str(path), version)
        if self._last is not None and self._last != path:
            shutil.rmtree(self._last, ignore_errors=True)
        self._last = path
        return served
