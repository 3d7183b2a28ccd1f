"""The runtime's per-stage memory prediction: inputs counted off the stage modules, then the one
formula (memory_model) over the run's action lists."""

import torch

from pipeboard.trainer.runtime.memory_predict import (
    measure_stages,
    optimizer_kind,
    predict_workers,
    predicted_bytes_per_stage,
)
from pipeboard.trainer.schedule.builder import build


def two_stages():
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), torch.nn.Sequential(torch.nn.Linear(8, 2))]


def test_counted_inputs_match_a_hand_count():
    first, second = measure_stages(two_stages(), torch.randn(3, 4))
    # Linear saves its input (3x4 floats), ReLU its output (3x8); parameters are weights, not activations
    assert first.activation_bytes == (3 * 4 + 3 * 8) * 4
    assert first.weight_bytes == (4 * 8 + 8) * 4 and first.output_bytes == 3 * 8 * 4 and first.input_bytes == 3 * 4 * 4
    assert second.activation_bytes == 3 * 8 * 4 and second.input_bytes == 3 * 8 * 4
    assert second.weight_bytes == (8 * 2 + 2) * 4 and second.output_bytes == 0


def test_counting_keeps_nothing_of_the_stages_once_they_go():
    """A launcher counts before every run (tuner --verify, benches: hundreds of runs in one
    process): the stages, their activations and the graph go with the last reference to them.
    ReLU saves its own output, which a pack hook returning that tensor would tie into a cycle
    through autograd's graph that Python's collector cannot see."""
    import gc
    import weakref

    stages = two_stages()
    gone = [weakref.ref(p) for m in stages for p in m.parameters()]
    measure_stages(stages, torch.randn(3, 4), loss=torch.nn.functional.cross_entropy, target=torch.tensor([0, 1, 1]))
    del stages
    gc.collect()
    assert all(ref() is None for ref in gone)


def test_what_the_stage_holds_beyond_autograd_is_counted():
    """Stage 1 ends in a Linear, which saves its input only: the output the stage holds until its
    gradient comes counts too; the last stage's loss saves its log-softmax (the logits' size); a
    Linear's output gradient waits for W."""
    first, second = measure_stages(two_stages(), torch.randn(3, 4), loss=torch.nn.functional.cross_entropy,
                                   target=torch.tensor([0, 1, 1]))
    assert first.recompute_bytes == (3 * 4 + 3 * 8) * 4  # the input (the data) and the output
    # its input, the logits' log-softmax, the target (int64) and nll_loss's total weight (a float)
    assert second.recompute_bytes == (3 * 8 + 3 * 2) * 4 + 3 * 8 + 4
    assert second.activation_bytes == second.recompute_bytes
    assert first.weight_grad_bytes == 3 * 8 * 4 and second.weight_grad_bytes == 3 * 2 * 4
    assert first.weight_input_bytes == 3 * 4 * 4 and second.weight_input_bytes == 3 * 8 * 4


def test_optimizer_state_is_read_off_the_optimizer():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_kind(torch.optim.Adam(p)) == "adam"
    assert optimizer_kind(torch.optim.SGD(p, lr=0.1, momentum=0.9)) == "sgd"
    assert optimizer_kind(torch.optim.SGD(p, lr=0.1)) == "sgd-plain"


def test_per_stage_prediction_follows_the_schedule_and_recompute():
    stages = measure_stages(two_stages(), torch.randn(3, 4))
    gpipe = predicted_bytes_per_stage(build("gpipe", 2, 4), stages, "adam")
    one_f_one_b = predicted_bytes_per_stage(build("1f1b", 2, 4), stages, "adam")
    assert one_f_one_b[0] < gpipe[0]  # 1f1b keeps 2 microbatches on stage 0, gpipe all 4
    redone = predict_workers(build("gpipe", 2, 4), stages, "adam", recompute=[0])
    plain = predict_workers(build("gpipe", 2, 4), stages, "adam")
    assert redone[0].activations == 4 * stages[0].recompute_bytes + stages[0].activation_bytes
    assert plain[0].activations == 4 * stages[0].activation_bytes
    assert redone[0].weights == plain[0].weights == stages[0].weight_bytes
    assert plain[0].optimizer == 2 * stages[0].weight_bytes
