"""A second set of weights that writes the tool responses (the ``simulator`` and ``separate`` arms).

EnvACE's policy acts and rehearses with one set of weights. Its comparison arms give the tool turns
to other weights (docs/training.md, "The arms"):

* ``simulator`` — frozen weights write every tool turn inline, as context: the policy trains on its
  act tokens only and the simulator never changes;
* ``separate`` — trainable weights of their own write every tool turn as ``rehearse`` tokens: each
  set is trained by its own role's tokens (:func:`routed_logprobs`), from the same reward.

The simulator is built in ``configure_model`` beside the policy (:func:`build_simulator`): a
submodule of the LightningModule, so it lives on the module's device and its weights are in the
checkpoint. With LoRA it shares the policy's frozen base tensors (:func:`share_frozen`), so the
second set costs its adapters only.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from envace.data.batch import TokenBatch
from envace.policy import PolicySpec, checkpoint_spec, load_checkpoint, load_model, read_checkpoint
from envace.types import ROLE_IDS

#: sources that start from the policy itself (same architecture, tokenizer and base weights)
FROM_POLICY = ("warm_start", "policy")


@dataclass
class SimulatorSpec:
    """The weights that write the tool responses of training rollouts, when they are not the policy's.

    Args:
        source: where the simulator's weights come from:
            ``warm_start`` — the policy as it is when RL begins (after ``warm_start_steps``): grounded
            on the same data as the policy, the strongest simulator there is without an environment;
            until then the policy itself rehearses (in validation);
            ``policy`` — a copy of the policy as it is built (the same base and adapter initialisation);
            a Lightning ``.ckpt`` (its policy weights), a ``save_pretrained`` folder or a hub id (the
            policy's tokenizer: it writes the episode's own tokens).
        trainable: train the simulator on the ``rehearse`` tokens with its own weights, the policy on
            the ``act`` tokens only (the ``separate`` arm); else it is frozen: not in the optimizer,
            and its tool turns are context.
    """

    source: str = "warm_start"
    trainable: bool = False

    def __post_init__(self) -> None:
        if self.trainable and self.source not in FROM_POLICY:
            raise ValueError(
                f"simulator.trainable needs source {' or '.join(FROM_POLICY)} (the policy's base, which is the "
                f"KL reference and shares its frozen weights); got {self.source!r}"
            )

    @property
    def from_start(self) -> bool:
        """Whether the simulator's weights are final from the first step (all but ``warm_start``)."""
        return self.source != "warm_start"


def build_simulator(spec: SimulatorSpec, policy: Any, policy_spec: PolicySpec, share_base: bool = True) -> Any:
    """The simulator's model: a copy of ``policy`` (``warm_start``, ``policy``; its frozen base shared
    with the policy when ``share_base``), or loaded from a checkpoint, folder or hub id. A frozen
    simulator has no trainable parameter."""
    if spec.source in FROM_POLICY:
        model = copy.deepcopy(policy)
        if share_base:
            share_frozen(policy, model)
    elif spec.source.endswith(".ckpt"):
        if not Path(spec.source).is_file():
            raise FileNotFoundError(f"simulator.source: checkpoint not found: {spec.source}")
        ckpt = read_checkpoint(spec.source)
        model = load_checkpoint(checkpoint_spec(ckpt) or policy_spec, spec.source, ckpt)
    else:
        model = load_model(dataclasses.replace(policy_spec, name_or_path=spec.source, lora=None))
    if not spec.trainable:
        model.requires_grad_(False).eval()
    return model


def share_frozen(policy: Any, simulator: Any) -> int:
    """Point ``simulator``'s parameters at ``policy``'s wherever the policy's are frozen (the LoRA
    base: identical in a copy, and never updated), so the second model costs its own trainable
    weights only. Returns how many tensors are shared."""
    shared = 0
    for (name, mine), (other, theirs) in zip(policy.named_modules(), simulator.named_modules(), strict=True):
        if name != other:
            raise ValueError(f"share_frozen: module {name!r} against {other!r}: not a copy of the policy")
        for key, p in mine._parameters.items():
            if p is not None and not p.requires_grad:
                theirs._parameters[key] = p
                shared += 1
    return shared


def own_parameters(policy: Any, simulator: Any) -> dict[str, Tensor]:
    """The simulator's parameters that are not the policy's tensors (its adapters, under LoRA)."""
    theirs = {id(p) for p in policy.parameters()}
    return {n: p for n, p in simulator.named_parameters() if id(p) not in theirs}


def copy_policy_into(policy: Any, simulator: Any) -> None:
    """Make the simulator's own weights the policy's current ones (the ``warm_start`` snapshot)."""
    source = dict(policy.named_parameters())
    for name, p in own_parameters(policy, simulator).items():
        p.data.copy_(source[name].data)


def routed_logprobs(
    policy_lp: Callable[[TokenBatch], Tensor], simulator_lp: Callable[[TokenBatch], Tensor], batch: TokenBatch
) -> Tensor:
    """``[B, T]`` log-probs of ``batch``'s loss tokens, each from the weights that wrote it: act (and
    every non-``rehearse``) tokens from the policy, ``rehearse`` tokens from the simulator. Each
    model's forward computes its own role's positions only, so a role's loss reaches its own
    weights and no other."""
    rehearse = (batch.roles == ROLE_IDS["rehearse"]).to(batch.loss_mask.dtype)
    acts = batch._replace(loss_mask=batch.loss_mask * (1 - rehearse))
    responses = batch._replace(loss_mask=batch.loss_mask * rehearse)
    return policy_lp(acts) * (1 - rehearse) + simulator_lp(responses) * rehearse
