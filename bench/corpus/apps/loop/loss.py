"""The training loss as the corpus's reports wrote it: correct, or with one of their bugs.

Every function returns the summed token loss and the number of tokens it counted, so the loop
can normalise over an optimizer step the way the clean twin does (sum over the step's tokens,
divided by their count: transformers PR 34191's fix) or the way a report did.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.corpus.apps.loop.data import IGNORE, PAD

EOS = 2
"""A real token taken as the end-of-text id that the pad id was set to (pad = eos, as in
LLaMA's tokenizer, where both are 2): bug.eos_masked_as_padding masks it as padding."""


TRAIN_TEMPERATURE = 0.7
"""The sampling temperature that bug.train_logits_tempered divides the training logits by."""


def token_loss(
    logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor, bug, smoothing: float = 0.0
) -> tuple:
    """(summed cross-entropy, tokens counted) of one micro-batch under the switches in `bug`;
    `smoothing`: label smoothing (0: none)."""
    target = y
    if bug.eos_masked_as_padding:  # labels[labels == pad_token_id] = -100, with pad = eos:
        target = torch.where(y == EOS, torch.full_like(y, IGNORE), y)  # (torchtune#949)
    if bug.loss_mask_first_label_dropped:  # the loss mask one position off: each row's first
        target = target.clone()  # label is left out of the loss (NVIDIA-NeMo/Speech PR 6409)
        target[:, 0] = IGNORE
    if bug.padding_in_loss:  # labels = input ids: padding is a target like any token
        target = torch.where(y == IGNORE, torch.full_like(y, PAD), y)
    if bug.labels_not_shifted:  # the current token as its own target
        target = torch.where(y == IGNORE, y, x)
    if bug.labels_shifted_twice:  # pre-shifted labels shifted again: the token after next
        logits, target = logits[:, :-1], target[:, 1:]
    if bug.double_softmax:  # probabilities into a loss that applies log-softmax itself
        logits = logits.softmax(-1)
    if bug.train_logits_tempered:  # logits / rollout_temperature (0.7) in the training loss
        logits = logits / TRAIN_TEMPERATURE  # only; the eval reads them untempered
        # (GMISWE/tinker-cloud PR 26)
    flat = logits.reshape(-1, logits.shape[-1])
    if bug.nll_on_probabilities:  # NLLLoss on softmax outputs, not log_softmax: the loss is
        probs = flat.softmax(-1)  # -p(target), always negative (yanx27/Pointnet_Pointnet2_pytorch
        total = F.nll_loss(probs, target.reshape(-1), ignore_index=IGNORE, reduction="sum")  # #30)
        return total, int((target != IGNORE).sum())
    if bug.log_softmax_wrong_dim:  # log_softmax over the batch, then NLL (pointnet.pytorch#27)
        flat = logits.log_softmax(0).reshape(-1, logits.shape[-1])
        total = F.nll_loss(flat, target.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return total, int((target != IGNORE).sum())
    if smoothing and bug.label_smoothing_mass_added:  # (1 - eps) y + 1/K (TimDettmers/ConvE#55)
        real = target.reshape(-1) != IGNORE
        onehot = F.one_hot(target.reshape(-1)[real], flat.shape[-1]).float()
        soft = (1.0 - smoothing) * onehot + 1.0 / flat.shape[-1]
        return -(soft * flat[real].log_softmax(-1)).sum(), int(real.sum())
    if smoothing and bug.label_smoothing_over_padding:  # the uniform part over every position:
        log_probs = flat.log_softmax(-1)  # -log_preds.sum(-1) reduced with padding's rows in it,
        nll = F.nll_loss(log_probs, target.reshape(-1), ignore_index=IGNORE)  # the NLL without
        uniform = -log_probs.sum(-1).mean() / flat.shape[-1]  # (pytorch/pytorch#73205, #7455)
        count = int((target != IGNORE).sum())
        return ((1.0 - smoothing) * nll + smoothing * uniform) * count, count
    if smoothing:
        total = F.cross_entropy(
            flat,
            target.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
            label_smoothing=smoothing,
        )
        return total, int((target != IGNORE).sum())
    total = F.cross_entropy(flat, target.reshape(-1), ignore_index=IGNORE, reduction="sum")
    if bug.loss_mean_over_padding:  # the masked loss averaged over every position, padding's
        return total, target.numel()  # zeros included (d2l-ai/d2l-en#2076)
    return total, int((target != IGNORE).sum())


def eval_loss(
    model,
    data: dict,
    over_padding: bool = False,
    smoothing: float = 0.0,
    last_batch: int = 0,
    per_row_of: int = 0,
    drop_last: int = 0,
    divided_in_loop: int = 0,
    mean_of_batches: int = 0,
    mask_from_inputs: bool = False,
    backward: int = 0,
    optimizer=None,
) -> float:
    """Mean next-token loss over the held-out set's real tokens (the correct loss), or
    (`over_padding`: bug.loss_mean_over_padding) the masked per-position losses averaged over
    every position, padding's zeros included; `smoothing` (bug.eval_loss_label_smoothed): the
    training criterion's label smoothing applied to the held-out targets too (0: none);
    `last_batch` (bug.eval_loss_last_batch): the set read in batches of that many rows and the
    last batch's loss returned in place of the average over them all (0: the whole set);
    `per_row_of` (bug.eval_loss_over_dataset_size): the set read in batches of that many rows,
    each batch's mean loss summed and the sum divided by the number of rows, not of batches;
    `drop_last` (bug.eval_drop_last): the set read in batches of that many rows by a loader with
    drop_last=True, so the partial last batch is never evaluated (0: every row);
    `divided_in_loop` (bug.eval_loss_divided_in_loop): the set read in batches of that many rows,
    each batch's mean loss added to a running total that is divided by the number of batches so
    far inside the loop, at every batch, instead of once after it (0: the whole set);
    `mean_of_batches` (bug.eval_loss_mean_of_batch_means): the set read in batches of that many
    rows and the batches' mean token losses averaged with equal weight, whatever each batch's
    count of real tokens (0: every token weighted alike); `mask_from_inputs`
    (bug.eval_loss_mask_from_inputs): the loss mask taken from the inputs' padding mask, not
    the shifted labels', so each row shorter than the maximum also counts the loss of
    predicting the first padding token after its last real one. `backward`
    (bug.eval_loss_backpropagated): the set read in batches of that many rows with gradients on,
    each batch's mean loss backpropagated as the training loss is, with no optimizer step, so
    its gradients stay in .grad (0: no backward); `optimizer` (with `backward`,
    bug.optimizer_stepped_in_validation): the optimizer zeroed and stepped around each batch's
    backward, as the training loop does, so the weights are updated on the held-out batches
    (None: no update)."""
    if backward:  # run_epoch(valid, model, SimpleLossCompute(..., opt=None)): loss.backward()
        summed, tokens = 0.0, 0  # all the same (harvardnlp/annotated-transformer#14); or the
        for start in range(0, len(data["x"]), backward):  # training step's lines in the
            logits = model(data["x"][start : start + backward])  # validation loop,
            flat = logits.reshape(-1, logits.shape[-1])  # optimizer.step() included
            target = data["y"][start : start + backward].reshape(-1)  # (SKrisanski/FSCT#12)
            total = F.cross_entropy(flat, target, ignore_index=IGNORE, reduction="sum")
            count = int((target != IGNORE).sum())
            if optimizer is not None:
                optimizer.zero_grad()
            (total / count).backward()
            if optimizer is not None:
                optimizer.step()
            summed += float(total.detach())
            tokens += count
        return summed / tokens
    if mask_from_inputs:  # loss over attention_mask[:, :-1] with right padding: the last real
        target = torch.where(data["x"] != PAD, data["y"], IGNORE)  # input's label, a pad, is
        target = torch.where((target == IGNORE) & (data["x"] != PAD), PAD, target)  # counted
        data = {**data, "y": target}  # (SkyworkAI/Skywork#55)
    if mean_of_batches:  # nlls.append(neg_log_likelihood); ppl = exp(stack(nlls).mean()): the
        with torch.no_grad():  # per-batch means averaged, each batch one vote however many
            means = []  # tokens it holds (huggingface/transformers PR 34387, #34138)
            for start in range(0, len(data["x"]), mean_of_batches):
                logits = model(data["x"][start : start + mean_of_batches])
                flat = logits.reshape(-1, logits.shape[-1])
                target = data["y"][start : start + mean_of_batches].reshape(-1)
                means.append(float(F.cross_entropy(flat, target, ignore_index=IGNORE)))
        return sum(means) / len(means)
    if divided_in_loop:  # eval_loss += loss; eval_steps += 1; eval_loss /= eval_steps, all inside
        with torch.no_grad():  # the batch loop (lucidrains/reformer-pytorch#147)
            running = 0.0
            starts = range(0, len(data["x"]), divided_in_loop)
            for steps, start in enumerate(starts, start=1):
                logits = model(data["x"][start : start + divided_in_loop])
                flat = logits.reshape(-1, logits.shape[-1])
                target = data["y"][start : start + divided_in_loop].reshape(-1)
                running += float(F.cross_entropy(flat, target, ignore_index=IGNORE))
                running /= steps
        return running
    if drop_last:  # DataLoader(val_set, batch_size, drop_last=True) (ai2cm/ace#647, verl#78)
        with torch.no_grad():
            summed, tokens = 0.0, 0
            for start in range(0, len(data["x"]) - drop_last + 1, drop_last):
                logits = model(data["x"][start : start + drop_last])
                flat = logits.reshape(-1, logits.shape[-1])
                target = data["y"][start : start + drop_last].reshape(-1)
                summed += float(F.cross_entropy(flat, target, ignore_index=IGNORE, reduction="sum"))
                tokens += int((target != IGNORE).sum())
        return summed / tokens
    if per_row_of:  # test_loss += loss_fn(pred, y).item(); test_loss /= len(dataloader.dataset)
        with torch.no_grad():  # (pytorch/tutorials#1486): batch means over a count of rows
            summed = 0.0
            for start in range(0, len(data["x"]), per_row_of):
                logits = model(data["x"][start : start + per_row_of])
                flat = logits.reshape(-1, logits.shape[-1])
                target = data["y"][start : start + per_row_of].reshape(-1)
                summed += float(F.cross_entropy(flat, target, ignore_index=IGNORE))
        return summed / len(data["x"])
    if last_batch:  # the loss variable left from the loop logged (DeepLearningExamples PR 299)
        with torch.no_grad():
            for start in range(0, len(data["x"]), last_batch):
                logits = model(data["x"][start : start + last_batch])
                flat = logits.reshape(-1, logits.shape[-1])
                target = data["y"][start : start + last_batch].reshape(-1)
                loss = F.cross_entropy(flat, target, ignore_index=IGNORE)
        return float(loss)
    with torch.no_grad():
        logits = model(data["x"])
        flat = logits.reshape(-1, logits.shape[-1])
        if over_padding:
            losses = F.cross_entropy(
                flat, data["y"].reshape(-1), ignore_index=IGNORE, reduction="none"
            )
            return float(losses.mean())
        if smoothing:  # the training criterion reused (pytorch/pytorch#129050)
            return float(
                F.cross_entropy(
                    flat, data["y"].reshape(-1), ignore_index=IGNORE, label_smoothing=smoothing
                )
            )
        return float(F.cross_entropy(flat, data["y"].reshape(-1), ignore_index=IGNORE))
