"""The profile cache's name for a user's step follows the code it runs (issue 37, item 2): lambdas and
partials around a step builder, closures, globals and the optimizer's hyper-parameters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fl_client.step_identity import step_identity

STEP = """
def make_step(model, lr, mu):
    opt = torch.optim.{optimizer}(model.parameters(), lr=lr)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y){extra}
        loss.backward()
        opt.step()

    return step

fedprox = lambda m: make_step(m, {lr}, {mu})
"""


def user_module(
    optimizer: str = "SGD", lr: float = 0.05, mu: float = 0.01, extra: str = ""
) -> dict[str, Any]:
    """A user's task module as Python loads it (no file behind it: bytecode is what is read)."""
    namespace: dict[str, Any] = {"torch": torch, "F": F}
    exec(STEP.format(optimizer=optimizer, lr=lr, mu=mu, extra=extra), namespace)
    return namespace


def test_the_same_code_has_the_same_identity_wherever_it_is_loaded() -> None:
    a, b = user_module(), user_module()
    assert step_identity(a["fedprox"]) == step_identity(b["fedprox"])
    assert step_identity(functools.partial(a["make_step"], lr=0.05)) == step_identity(
        functools.partial(b["make_step"], lr=0.05)
    )


def test_an_edited_step_behind_a_lambda_is_another_step() -> None:
    """`lambda m: make_step(m, lr, mu)`: the lambda's line is unchanged, the step it calls is not."""
    base = step_identity(user_module()["fedprox"])
    assert step_identity(user_module(optimizer="Adam")["fedprox"]) != base  # another optimizer
    assert step_identity(user_module(extra=" + 0.0 * loss")["fedprox"]) != base  # another loss
    assert step_identity(user_module(mu=0.1)["fedprox"]) != base  # the lambda's own constant


def test_a_partial_covers_its_function_and_its_arguments() -> None:
    sgd, adam = user_module()["make_step"], user_module(optimizer="Adam")["make_step"]
    base = step_identity(functools.partial(sgd, lr=0.05, mu=0.01))
    assert step_identity(functools.partial(adam, lr=0.05, mu=0.01)) != base
    assert step_identity(functools.partial(sgd, lr=0.1, mu=0.01)) != base
    assert step_identity(functools.partial(sgd, lr=0.05, mu=0.01)) == base


def _closure_factory(lr: float, opt_class: type) -> Callable[[nn.Module], Any]:
    def make(model: nn.Module) -> Any:
        opt = opt_class(model.parameters(), lr=lr)
        return lambda x, y: opt.step()

    return make


def test_closures_and_a_captured_optimizer_are_covered() -> None:
    base = step_identity(_closure_factory(0.05, torch.optim.SGD))
    assert step_identity(_closure_factory(0.05, torch.optim.SGD)) == base
    assert step_identity(_closure_factory(0.5, torch.optim.SGD)) != base  # a closure's value
    assert step_identity(_closure_factory(0.05, torch.optim.Adam)) != base  # a closure's class
    net = nn.Linear(4, 2)
    momentum = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    plain = torch.optim.SGD(net.parameters(), lr=0.1)
    assert step_identity(lambda m, o=momentum: o) != step_identity(lambda m, o=plain: o)  # hyper-parameters


class Trainer:
    def __init__(self, lr: float) -> None:
        self.lr = lr

    def make_step(self, model: nn.Module) -> Any:
        return lambda x, y: None


def test_a_bound_method_is_its_function_and_its_class(tmp_path: Path) -> None:
    assert step_identity(Trainer(0.1).make_step) == step_identity(Trainer(0.2).make_step)  # set at run time
    assert step_identity(Trainer(0.1).make_step) != step_identity(user_module()["fedprox"])


def test_a_recursive_helper_and_a_huge_global_table_are_described_in_finite_time() -> None:
    namespace: dict[str, Any] = {"TABLE": dict.fromkeys(range(100_000), 1.0)}
    exec(
        "def helper(n):\n    return helper(n - 1) if n else TABLE[0]\nstep = lambda m: helper(3)\n", namespace
    )
    assert len(step_identity(namespace["step"])) == 64
