"""diag/invariants.py on crafted numbers: each invariant holds on a healthy loop's numbers and
breaks on the bug it names (the corpus rows in bench/corpus/corpus.yaml)."""

from __future__ import annotations

import math

from hyprun.diag import invariants as inv


def test_modules_in_eval_mode_at_a_train_step_are_named():
    assert inv.modules_not_training({"drop": True, "bn": True}) == []
    (violation,) = inv.modules_not_training({"drop": False, "bn": True})
    assert violation.invariant == "train_mode_while_training" and violation.where == "drop"


def test_modules_still_training_at_an_eval_forward_are_named():
    assert inv.modules_training_at_eval({"drop": False}) == []
    assert inv.modules_training_at_eval({"drop": True})[0].invariant == "eval_mode_while_evaluating"


def test_a_gradient_left_over_at_a_steps_start_breaks_the_reset_invariant():
    assert inv.stale_gradients({0: 0.0, 1: 0.0, 2: 0.0}) == []
    stale = inv.stale_gradients({0: 0.0, 1: 0.41, 2: 0.0, 3: math.nan})  # no zero_grad at 1
    assert [v.where for v in stale] == ["step 1", "step 3"]


def test_trainable_parameters_without_a_gradient_or_an_optimizer_are_named():
    names = ["emb", "block.w", "head.w"]
    assert inv.params_without_gradient(names, names) == []
    assert [v.where for v in inv.params_without_gradient(names, ["emb", "head.w"])] == ["block.w"]
    assert inv.params_not_in_optimizer(names, names) == []
    (missing,) = inv.params_not_in_optimizer(names, ["emb", "block.w"])  # head replaced later
    assert missing.where == "head.w"


def test_the_loss_keeps_its_scale_when_a_batch_is_split_into_accumulation_steps():
    tokens = 160  # 4 micro-batches of 40
    assert inv.accumulation_scale([(4, 1.0, tokens)]) == []  # a mean over the step's tokens
    assert inv.accumulation_scale([(4, 1.0 * tokens, tokens)]) == []  # a sum, as unsplit
    assert inv.accumulation_scale([(4, 0.7, tokens)]) == []  # a deliberate weight on the loss
    (not_divided,) = inv.accumulation_scale([(4, 4.0, tokens)])  # each mean, summed
    assert not_divided.where == "4 micro-batches" and "weigh 4 " in not_divided.evidence
    assert inv.accumulation_scale([(4, 0.25, tokens)])  # divided twice
    assert inv.accumulation_scale([(1, 4.0, tokens)]) == []  # no split: not this invariant


def test_a_step_with_gradients_above_the_declared_clip_was_not_clipped_before_it():
    clipped = [0.25 * 3.1 / (3.1 + 1e-6), 0.2]  # clip_grad_norm_'s result, a small norm
    assert inv.clipping_not_applied(0.25, clipped) == []
    (late,) = inv.clipping_not_applied(0.25, [0.2, 3.1])  # clipped after the step
    assert late.where == "step 1" and "3.1 at the optimizer step" in late.evidence
    assert inv.clipping_not_applied(0.0, [3.1]) == []  # no clipping declared


def test_the_same_batch_two_steps_in_a_row_is_a_loop_that_draws_no_new_one():
    assert inv.repeated_batches([11, 12, 13]) == []
    (again,) = inv.repeated_batches([11, 12, 12])
    assert again.where == "step 2"
    assert len(inv.repeated_batches([11, 11, 11])) == 2


def test_a_target_the_attention_mask_hides_is_padding_in_the_loss():
    assert inv.loss_on_padding([(0, 120)]) == []
    (padding,) = inv.loss_on_padding([(0, 120), (30, 120)])
    assert padding.where == "call 1" and padding.evidence.startswith("30 of 120")


def test_without_a_mask_the_declared_pad_id_at_a_rows_ends_is_padding():
    """Right and left padding, less the pad next to the text (a real end-of-text token where
    the padding reuses its id); a pad id inside the text is text."""
    import torch

    from hyprun.runner.job.invariant_hooks import padded_targets, padding_mask

    ids = torch.tensor([[5, 6, 7, 0, 0, 0], [5, 0, 6, 7, 8, 9], [0, 0, 5, 6, 7, 8]])
    assert padding_mask(ids, pad_id=0).tolist() == [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1, 1],
    ]
    labels = torch.cat([ids[:, 1:], torch.full((3, 1), -100)], dim=1)  # next tokens, padding kept
    assert padded_targets(padding_mask(ids, 0), labels, -100) == (2, 15)
    ignored = labels.masked_fill(padding_mask(ids, 0).roll(-1, 1) == 0, -100)
    assert padded_targets(padding_mask(ids, 0), ignored, -100)[0] == 0


def test_targets_must_be_the_next_tokens():
    shifted, copied, twice = (0.1, 1.0, 0.05), (1.0, 0.1, 0.02), (0.05, 0.1, 1.0)
    assert inv.labels_misaligned([shifted]) == [] and inv.labels_judged([shifted])
    (copy,) = inv.labels_misaligned([shifted, copied])
    assert copy.where == "call 1" and "input 0 position(s) on" in copy.evidence
    assert inv.labels_misaligned([twice])[0].evidence.startswith("100% of the targets")
    classifier = (0.0, 0.01, 0.0)  # labels unrelated to the inputs: not judged
    assert inv.labels_misaligned([classifier]) == [] and not inv.labels_judged([classifier])
    repetitive = (0.95, 1.0, 0.9)  # a text of long runs: the next token still matches
    assert inv.labels_misaligned([repetitive]) == []


def test_an_lr_that_collapses_before_the_last_quarter_is_a_broken_schedule():
    cosine = [0.5 * (1 + math.cos(math.pi * s / 100)) for s in range(100)]  # ends near 0
    assert inv.schedule_collapse(cosine, 100) == []
    per_epoch_step_lr = [0.5 ** (s // 50) for s in range(100)]  # StepLR(gamma .5) per epoch
    assert inv.schedule_collapse(per_epoch_step_lr, 100) == []
    milestones = [0.1 ** sum(s >= m for m in (30, 60, 80)) for s in range(100)]  # 1e-3 at 80%
    assert inv.schedule_collapse(milestones, 100) == []
    gamma_zero = [0.0 if s >= 55 else 1.0 for s in range(100)]  # StepLR(gamma=0) off at 55%
    (violation,) = inv.schedule_collapse(gamma_zero, 100)
    assert violation.where == "step 55 of 100"
    per_batch = [0.5**s for s in range(100)]  # the same StepLR stepped per batch
    (violation,) = inv.schedule_collapse(per_batch, 100)
    assert violation.where == "step 10 of 100"  # 0.5^10 < 1e-3


def test_a_mostly_frozen_model_is_an_l0_warning():
    assert inv.mostly_frozen(90, 100) == []  # 10% frozen (an embedding, say)
    assert inv.mostly_frozen(5, 100)[0].invariant == "params_frozen"


def test_replicas_agree_unless_a_checksum_differs():
    assert inv.replicas_disagree([12.5, 12.5]) == []
    assert inv.replicas_disagree([12.5]) == []
    (violation,) = inv.replicas_disagree([12.5, 12.5, 12.51])
    assert violation.where == "rank 2"


def test_padding_is_read_only_where_the_targets_are_the_next_tokens():
    """Labels shuffled apart from their inputs (another row's next tokens) are not the input ids
    shifted by one: the input's padding then says nothing about which targets are padding."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from hyprun.runner.job.invariant_hooks import InvariantHooks

    def reads(targets_of) -> list:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 32))
        hooks = InvariantHooks(model)
        hooks.pad_id = 0
        ids = torch.randint(1, 32, (8, 17), generator=torch.Generator().manual_seed(1))
        for row in range(8):
            ids[row, 9 + row :] = 0  # right padding of each row's length, kept in the targets
        logits = model(ids[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), targets_of(ids).flatten()).backward()
        hooks.remove()
        return hooks.padding_reads

    (padded,) = reads(lambda ids: ids[:, 1:])  # labels = input_ids, padding left in
    assert padded[0] > 0

    def half_shuffled(ids):  # half the rows get another row's next tokens
        targets = ids[:, 1:].clone()
        targets[::2] = ids.roll(1, 0)[::2, 1:]
        return targets

    assert reads(half_shuffled) == []
