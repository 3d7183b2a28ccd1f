"""The model zoo: listed, deterministic, fixed splits, argument errors, and every model learns."""

from __future__ import annotations

import pytest
import torch

from pipeboard.trainer import zoo

# Small model arguments keep the training checks fast; the defaults are checked for shape only.
SMALL = {
    "mlp-digits": {"hidden": 32},
    "cnn-digits": {"channels": 8},
    "resnet-digits": {"channels": 8, "blocks": 2},
    "transformer-text": {"dim": 32, "layers": 1, "heads": 2, "seq_len": 16},
    "mlp": {"depth": 2, "width": 32, "samples": 512},
    "gpt2-text": {"layers": 1, "dim": 32, "heads": 2, "seq_len": 16},
    "llama-text": {"layers": 1, "dim": 32, "heads": 2, "seq_len": 16},
    "bert-text": {"layers": 1, "dim": 32, "heads": 2, "seq_len": 16},
    "resnet18-images": {"width": 4, "size": 16},
}
IN_MEMORY = ["mlp-digits", "cnn-digits", "resnet-digits", "transformer-text", "mlp"]  # TensorDataset data


pytestmark = pytest.mark.usefixtures("one_thread")


def test_names_and_describe_agree_with_the_entries():
    assert zoo.names() == IN_MEMORY + ["gpt2-text", "llama-text", "bert-text", "resnet18-images"]
    for d in zoo.describe():
        entry = zoo.get(d["name"], **SMALL[d["name"]])
        assert entry.name == d["name"]
        assert (entry.metric_name, entry.target, entry.metric_higher_is_better) == (d["metric"], d["target"], d["higher_is_better"])
        assert entry.description == d["description"]
        assert set(SMALL[d["name"]]) <= set(d["args"]) and entry.model_args == SMALL[d["name"]]
    mlp = next(d for d in zoo.describe() if d["name"] == "mlp")
    assert mlp["args"]["depth"] == 8 and mlp["args"]["width"] == 1024  # the runtime's benchmark model


def test_benchmark_mlp_defaults():
    entry = zoo.get("mlp")
    linears = [m for m in entry.model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 9 and linears[0].weight.shape == (1024, 1024)
    assert entry.example_input(4).shape == (4, 1024)


@pytest.mark.parametrize("name", list(SMALL))
def test_same_seed_same_weights_and_batches(name):
    a, b = zoo.get(name, seed=3, **SMALL[name]), zoo.get(name, seed=3, **SMALL[name])
    c = zoo.get(name, seed=4, **SMALL[name])
    pa, pb, pc = (torch.cat([p.flatten() for p in e.model.parameters()]) for e in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    (x1, y1), (x2, y2) = next(a.train_batches(8, epoch=1)), next(b.train_batches(8, epoch=1))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    (xv1, _), (xv2, _) = next(a.val_batches(8)), next(c.val_batches(8))
    assert torch.equal(xv1, xv2)  # the validation split does not depend on the seed


@pytest.mark.parametrize("name", IN_MEMORY)
def test_same_seed_same_weights_and_data(name):
    a, b = zoo.get(name, seed=3, **SMALL[name]), zoo.get(name, seed=3, **SMALL[name])
    c = zoo.get(name, seed=4, **SMALL[name])
    pa, pb, pc = (torch.cat([p.flatten() for p in e.model.parameters()]) for e in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    # the validation split does not depend on the model seed
    assert all(torch.equal(u, v) for u, v in zip(a.val_data.tensors, c.val_data.tensors))
    (x1, y1), (x2, y2) = next(a.train_batches(8, epoch=1)), next(b.train_batches(8, epoch=1))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x3, _ = next(a.train_batches(8, epoch=2))
    assert not torch.equal(x1, x3)  # a new order each epoch


@pytest.mark.parametrize("name", IN_MEMORY)
def test_batches_cover_the_split_without_overlap(name):
    entry = zoo.get(name, **SMALL[name])
    batches = list(entry.train_batches(16, epoch=0))
    assert len(batches) == entry.train_size // 16 == entry.batches_per_epoch(16)
    assert all(x.shape[0] == 16 for x, _ in batches)
    assert sum(x.shape[0] for x, _ in entry.val_batches(64)) == entry.val_size > 0
    # train and validation rows are disjoint
    train_rows = {tuple(r.flatten().tolist()) for r in entry.train_data.tensors[0][:200]}
    assert not train_rows & {tuple(r.flatten().tolist()) for r in entry.val_data.tensors[0][:200]}
    example = entry.example_input(5)
    assert example.shape[0] == 5 and example.dtype == entry.train_data.tensors[0].dtype


@pytest.mark.parametrize("name", list(SMALL))
def test_a_few_steps_lower_the_loss(name):
    torch.manual_seed(0)
    entry = zoo.get(name, **SMALL[name])
    model = entry.model
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = next(entry.train_batches(64, epoch=0))
    with torch.no_grad():
        before = float(entry.loss(model(x), y))
    for _ in range(20):
        opt.zero_grad()
        loss = entry.loss(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(entry.loss(model(x), y))
    assert after < 0.9 * before, (before, after)
    value = entry.evaluate(batch_size=128)
    assert value == value and value >= 0  # a real number of the declared metric


def test_metrics():
    logits = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
    entry = zoo.get("mlp-digits", hidden=8)
    assert entry.metric_fn([logits[:2], logits[2:]], [torch.tensor([0, 1]), torch.tensor([1])]) == pytest.approx(2 / 3)
    assert entry.reached(0.96) and not entry.reached(0.5)
    lm = zoo.get("transformer-text", **SMALL["transformer-text"])
    uniform = torch.zeros(2, 4, 256)
    assert lm.metric_fn(uniform, torch.zeros(2, 4, dtype=torch.long)) == pytest.approx(256.0, rel=1e-4)
    assert not lm.metric_higher_is_better and lm.reached(5.0)


@pytest.mark.parametrize("name,args,words", [
    ("nope", {}, ["unknown zoo model", "mlp-digits"]),
    ("mlp", {"colour": 1}, ["colour", "depth"]),
    ("mlp", {"depth": "x"}, ["depth", "integer"]),
    ("mlp", {"width": 0}, ["width", ">= 1"]),
    ("transformer-text", {"dim": 30}, ["dim", "heads"]),
])
def test_bad_model_arguments_name_the_argument(name, args, words):
    with pytest.raises(ValueError) as info:
        zoo.get(name, **args)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_optimizer_matches_declaration():
    entry = zoo.get("mlp-digits", hidden=8)
    opt = entry.make_optimizer(entry.model.parameters())
    assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["lr"] == entry.lr


def test_train_to_target_reaches_the_digits_target():
    from pipeboard.trainer.zoo.fit import train_to_target

    entry = zoo.get("mlp-digits")
    result = train_to_target(entry, max_seconds=60)
    assert result.reached and result.metric >= entry.target and result.steps > 0
    assert result.epochs * entry.batches_per_epoch(entry.batch_size) == result.steps
