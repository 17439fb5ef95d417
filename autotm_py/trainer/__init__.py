"""Train a user's torch module under a memory plan: `Trainer` (docs/training-loop.md).

    trainer = autotm_py.Trainer(model, opt, loss_fn=F.cross_entropy, example=(x, y),
                                budget="4GiB")
    for x, y in loader:
        loss = trainer.step(x, y)
    trainer.sync()

`spec` reads the torch optimizer and identifies the loss, `state` maps graph tensors to the
module's and the optimizer's, `loop` makes the plan and runs its iterations, `core` holds the
Trainer, `files` trains an ONNX file's weights on arrays (`autotm train`). Names resolve
lazily: importing the package loads no torch.
"""

from __future__ import annotations

from autotm_py.exports import lazy_exports

_EXPORTS = {"Trainer": "autotm_py.trainer.core", "capture_training": "autotm_py.trainer.core",
            "train_file": "autotm_py.trainer.files",
            "FileTraining": "autotm_py.trainer.files"}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals)
