"""The training loop (colocate mode) and its parts: data sampling, engines, batching, evaluation.

``relax-gym train CONFIG`` runs :func:`train`; see :mod:`.colocate` for one step top to bottom.
"""

from .colocate import RunSummary, Trainer, make_backend, prepare_model, train

__all__ = ["RunSummary", "Trainer", "make_backend", "prepare_model", "train"]
