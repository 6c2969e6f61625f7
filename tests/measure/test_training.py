"""The one training step (measure.training.Step) and its options, each checked against a training loop
written out here by hand."""

import copy

import pytest
import torch
from torch import nn

from diagnostics.errors import ModelRunError
from diagnostics.measure.training import Step, Trainee, make_optimizer

X = torch.randn(8, 6, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(1))


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def loss_fn(out):
    return nn.functional.cross_entropy(out, Y)


def by_hand(m, steps, lr=0.05):
    """SGD with momentum 0.9 (the "sgd" every analysis offers), written out."""
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(m(X))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def weights(m):
    return [p.detach().clone() for p in m.parameters()]


def test_a_step_is_a_training_loops_step():
    a, b = model(), model()
    step = Step(Trainee(a, loss_fn, (X,)), True, "sgd", 0.05)
    losses = [step().item() for _ in range(3)]
    assert losses == by_hand(b, 3)
    assert all(torch.equal(p, q) for p, q in zip(weights(a), weights(b)))
    assert Step(Trainee(a, loss_fn, (X,)), False)() is None  # inference: a forward, no loss


def test_without_zero_grad_the_caller_clears_the_gradients():
    m = model()
    step = Step(Trainee(m, loss_fn, (X,)), True, "sgd", 0.05, zero_grad=False, update=lambda: None)
    step()
    once = m[0].weight.grad.clone()
    step()  # not cleared: the second backward adds to the first (the weights did not move)
    assert torch.allclose(m[0].weight.grad, 2 * once)
    step.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_without_an_optimizer_the_step_is_forward_and_backward_and_the_weights_stay():
    a, b = model(), model()
    a.register_parameter("extra", nn.Parameter(torch.zeros(2), requires_grad=False))  # frozen: in no optimizer
    a.extra.grad = torch.ones(2)
    step = Step(Trainee(a, loss_fn, (X,)), True, optimizer=None)
    before = weights(a)
    loss = step()
    loss_b = loss_fn(b(X))  # by hand: forward, loss, backward, no update
    loss_b.backward()
    assert loss.item() == loss_b.item()
    assert all(torch.equal(p, q) for p, q in zip(weights(a), before))  # the weights stay
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a[0].parameters(), b[0].parameters()))
    assert a.extra.grad is None  # zero_grad: every parameter of the model, as model.zero_grad clears them
    step()  # cleared first: the same gradients again, not twice them
    assert torch.equal(a[0].weight.grad, b[0].weight.grad)
    with torch.profiler.profile() as prof:
        step(label=True)
    assert {"zero_grad", "forward", "backward"} <= {e.name for e in prof.events()}
    assert "optimizer" not in {e.name for e in prof.events()}  # no optimizer phase without one


def test_after_backward_reads_the_gradients_before_the_update():
    m = model()
    seen = []
    step = Step(Trainee(m, loss_fn, (X,)), True, "sgd", 0.05)
    step(after_backward=lambda: seen.append((m[0].weight.grad.clone(), m[0].weight.detach().clone())))
    grad, before = seen[0]
    # plain SGD's first step with momentum: w' = w - lr * g
    assert torch.allclose(m[0].weight, before - 0.05 * grad)


def test_micro_batches_add_up_to_the_full_batchs_gradient():
    full, acc = model(), model()
    Step(Trainee(full, loss_fn, (X,)), True, "sgd", 0.05, update=lambda: None)()

    def halves(inputs):
        (x,) = inputs
        return [((x[:4],), lambda out: nn.functional.cross_entropy(out, Y[:4])),
                ((x[4:],), lambda out: nn.functional.cross_entropy(out, Y[4:]))]

    loss = Step(Trainee(acc, loss_fn, (X,)), True, "sgd", 0.05, split=halves, update=lambda: None)()
    assert loss.item() == pytest.approx(loss_fn(full(X)).item(), rel=1e-6)
    for p, q in zip(full.parameters(), acc.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_a_grad_scaler_unscales_before_the_update():
    a, b = model(), model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    Step(Trainee(a, loss_fn, (X,)), True, "sgd", 0.05, scaler=scaler)()
    by_hand(b, 1)
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(weights(a), weights(b)))
    assert a[0].weight.grad.abs().max() < 1  # unscaled in place: not 1024 times the gradient


def test_an_optimizer_built_elsewhere_and_converted_inputs():
    m = model()
    opt = make_optimizer(m.parameters(), "adam", 1e-3)
    seen = []
    step = Step(Trainee(m, loss_fn, (X,), prepare=lambda inputs: (seen.append(1), inputs)[1]), True, opt)
    step()
    assert step.optimizer is opt and len(opt.state) == 4 and seen == [1]


def test_a_failing_loss_is_named_and_out_of_memory_passes_through():
    def bad(out):
        raise ValueError("targets missing")

    with pytest.raises(ModelRunError, match=r"the loss \(my loss\) failed on the model's output: ValueError: "
                                            r"targets missing"):
        Step(Trainee(model(), bad, (X,), "my loss"), True)()

    def oom(out):
        raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        Step(Trainee(model(), oom, (X,)), True)()


def test_labelled_phases_are_the_profilers_step_ranges():
    from torch.profiler import ProfilerActivity, profile

    m = model()
    step = Step(Trainee(copy.deepcopy(m), loss_fn, (X,)), True, zero_grad=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(label=True)
    names = {e.name for e in prof.events()}
    assert {"forward", "backward", "optimizer"} <= names and "zero_grad" not in names  # cleared by the caller
