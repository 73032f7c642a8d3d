"""The corpus's plain PyTorch loop (bench/corpus/corpus.yaml, form `loop`): a Hydra app that logs
`eval_loss` to the MLflow run hyprun hands it and carries hyprun's Probe for L1 evidence.

Every bug of the corpus is one switch under `bug:`, written the way its report wrote it; all off
is the clean twin. The switches change only the lines their reports got wrong.
"""

from __future__ import annotations

import copy
import math
import random
from functools import partial

import hydra
import mlflow
import torch
from omegaconf import DictConfig

from bench.corpus.apps.loop.data import IGNORE, PAD, batch_order, sequences, weighted_order
from bench.corpus.apps.loop.loss import eval_loss, token_loss
from bench.corpus.apps.loop.model import TinyLM
from hyprun.runner.job.probe import Probe

RESTART_GAMMA = 0.9
"""The cosine schedule's peak decay per restart (the report's gamma)."""
LOADER_WORKERS = 4
"""Loader workers of an iterable dataset (bug.workers_duplicate_data: each yields every batch)."""
LR_FIND_START, LR_FIND_END = 1e-7, 10.0
"""The LR range test's sweep (train.lr_find): the optimizer built at 1e-7, as the report built it,
to pytorch-lr-finder's default end_lr, exponentially over the test's iterations."""
LR_FIND_SMOOTH, LR_FIND_DIVERGE = 0.05, 5.0
"""pytorch-lr-finder's smooth_f and diverge_th: the test stops once its smoothed loss exceeds
5 times the best one."""
OVERFLOW_AT = 256
"""The range of the dtype the ids were binarized in (bug.token_ids_overflow): uint8's 256, as
np.uint16's 65536 was for a 119547-token vocabulary."""
FIRST_TOKEN = PAD + 1
"""The first real token's id (bug.padding_idx_real_token): the id an embedding numbered from 0
without a padding token gives its first entry, taken as padding_idx."""
WARMUP_RATIO_DEFAULT = 0.0
"""The warmup_ratio option's default (bug.warmup_ratio_overrides_steps): `>= 0` passes for it, so
the warmup steps are recomputed as int(0.0 * t_total) = 0."""
EPOCH_BREAK_SHARE = 0.25
"""The share of an epoch's batches that run before a debugging break ends it
(bug.epoch_break_left_in): the break sat in the progress block, at the first progress report, a
quarter of the epoch here (32 of its 128 batches)."""
EVAL_LOADER_BATCH = 48
"""The validation loader's batch (bug.eval_drop_last): 48 does not divide the 128 held-out rows,
so drop_last=True leaves the last 32 rows out of every evaluation."""
NO_DECAY = ("bias", "norm", "ln_f")
"""Name parts of the parameters kept out of weight decay (optim.no_decay): biases and norms, as
this model names them."""
NO_DECAY_BERT = ("bias", "LayerNorm.weight")
"""BERT's list, as the scripts that copied it match names (bug.no_decay_names_mismatch): no
parameter of this model is named LayerNorm, so its norms are decayed."""


def build(cfg: DictConfig) -> tuple:
    """The model, its optimizer and the LR schedule (StepLR per epoch, or a per-step cosine),
    as each report built them."""
    torch.manual_seed(cfg.seed)
    m, bug = cfg.model, cfg.bug
    dropout = m.dropout
    if bug.dropout_keep_prob_as_p:  # keep_prob=0.9 ported as p (bonlime/keras-deeplab-v3-plus#4)
        dropout = 1 - m.dropout
    model = TinyLM(
        cfg.data.vocab, cfg.data.seq_len, m.n_layer, m.d_model, m.n_head, dropout, m.emb_dropout
    )
    model.causal = not bug.causal_mask_missing
    model.dropout_ignores_eval = bug.dropout_ignores_eval
    model.encoder_output_detached = bug.encoder_output_detached
    model.residual_overwritten = bug.residual_overwritten
    model.layer_norm_wrong_dim = bug.layer_norm_wrong_dim
    model.attention_unscaled = bug.attention_unscaled
    model.ffn_activation_missing = bug.ffn_activation_missing
    model.attention_mask_inverted = bug.attention_mask_inverted  # (rasbt/LLMs-from-scratch#1061)
    model.heads_merged_without_permute = bug.heads_merged_without_permute
    model.attention_softmax_over_queries = bug.attention_softmax_over_queries
    model.dropout_scaled_by_p = bug.dropout_scaled_by_p
    model.checkpoint_reentrant = bug.checkpoint_reentrant_frozen_inputs
    model.encoder_not_batch_first = bug.encoder_not_batch_first
    model.mask_after_softmax = bug.attention_mask_after_softmax  # (pytorch-image-models PR 2236)
    model.ffn_output_discarded = bug.ffn_output_discarded  # (theislab/CellFlow PR 296)
    model.mask_diagonal = bug.causal_mask_diagonal_masked  # (pbloem/former#10)
    model.mask_convention_mismatch = bug.attention_mask_convention_mismatch  # (cs249r_book PR 1785)
    model.attention_scale_inverted = bug.attention_scale_inverted  # (esceptico/perceiver-io#9)
    model.causal_train_only = bug.causal_mask_train_only  # (shiyu-coder/Kronos#199)
    model.attention_dropout_unused = bug.attention_dropout_unused  # (Informer2020#97)
    model.mask_float_added = bug.causal_mask_float_added  # (timeseriesAI/tsai#171)
    model.dropout_after_residual = bug.dropout_after_residual_add  # (hyunwoongko/transformer#8)
    model.dropout_zeroed_by_eval = bug.attention_dropout_zeroed_by_eval  # (Megatron-LM PR 411)
    model.logits_relu = bug.logits_relu  # (pytorch/tutorials PR 1644, huyng/tensorflow-vgg#13)
    model.softmax_across_heads = bug.attention_softmax_across_heads  # (detr#247)
    model.residual_dropout_discarded = bug.residual_dropout_not_assigned  # (templateGPT#1)
    model.emb_dropout_twice = bug.emb_dropout_applied_twice  # (TimDettmers/ConvE#19)
    model.pos_emb_detached = bug.pos_emb_read_through_data  # (d2l-ai/d2l-en PR 2121)
    model.tok_emb_scaled_twice = bug.tok_emb_scaled_twice  # (TensorAuto/OpenTau PR 179)
    model.ffn_norm_shared = bug.ffn_norm_shared  # (allenai/OLMo#222, lucidrains/mmdit#4)
    model.attention_scaled_by_num_heads = bug.attention_scaled_by_num_heads  # (tt-metal PR 56789)
    model.out_proj_discarded = bug.attention_out_proj_discarded  # (ethen8181/machine-learning#13)
    model.value_from_key = bug.value_uses_key_projection  # (yflyzhang/AnnotatedTransformer#1)
    model.dropout_backward_by_p = bug.attention_dropout_backward_by_p  # (NVIDIA/apex PR 816)
    model.layers_not_chained = bug.layers_not_chained  # (simon-ging/coot-videotext#5)
    model.pos_emb_redrawn = bug.pos_emb_recreated_each_forward  # (Stand-Alone-Self-Attention#2)
    model.attention_scaled_after_softmax = bug.attention_scaled_after_softmax  # (ViT#2)
    if bug.dropout_rate_not_passed:  # self.dropout = nn.Dropout(): the constructor's dropout
        for layer in model.encoder.layers:  # argument never passed on, so torch's default p=0.5
            layer.dropout = torch.nn.Dropout()  # replaces the configured rate in every layer's
            layer.dropout1 = torch.nn.Dropout()  # dropouts (huawei-noah/multi_hyp_cc PR 17,
            layer.dropout2 = torch.nn.Dropout()  # dimitymiller/cac-openset#1)
    if bug.layers_in_plain_list:  # self.layers = [Layer(...) for _ in range(n)]: a Python list,
        model.blocks = list(model.encoder.layers)  # so model.parameters() and .train()/.eval()
        model.encoder.layers = torch.nn.ModuleList()  # never reach the layers (pytorch/pytorch
        # #59925, #715; twitter/the-algorithm-ml PR 136)
    if bug.layers_share_weights:  # nn.ModuleList([layer] * n): one layer object, repeated, so
        layers = [model.encoder.layers[0]] * m.n_layer  # every layer is the first one's weights
        model.encoder.layers = torch.nn.ModuleList(layers)  # (zalandoresearch/pytorch-vq-vae#2,
        # espnet/espnet#1278, acids-ircam/ddsp_pytorch#37)
    if bug.padding_idx_real_token:  # nn.Embedding(n, d, padding_idx=0) over ids where 0 is a
        model.tok_emb.padding_idx = FIRST_TOKEN  # real entity (ibalazevic/TuckER#17): its row
        with torch.no_grad():  # zeroed and never given a gradient
            model.tok_emb.weight[FIRST_TOKEN].zero_()
    if bug.ffn_zero_init:  # both linear layers of each feed-forward block zero-initialised
        for layer in model.encoder.layers:  # (yz93/LAVT-RIS#25): nn.init.zeros_ on each weight
            torch.nn.init.zeros_(layer.linear1.weight)
            torch.nn.init.zeros_(layer.linear2.weight)
    if m.freeze_emb and bug.module_requires_grad_set:  # module.requires_grad = False: an attribute
        model.tok_emb.requires_grad = False  # on the nn.Module, which never reaches its parameters
        model.pos_emb.requires_grad = False  # (CSCYQJ/MICCAI23-ProtoContra-SFDA#18, catalyst PR 81)
    elif m.freeze_emb and bug.frozen_weights_decayed:
        pass  # frozen by zeroing their gradients after each backward instead (fit), so they stay
        # trainable parameters of the optimizer (huggingface/diffusers#1009, pytorch/pytorch#38581)
    elif m.freeze_emb:  # the embeddings frozen, as a fine-tuning run freezes its first layers
        for parameter in (*model.tok_emb.parameters(), *model.pos_emb.parameters()):
            parameter.requires_grad = False
    if bug.layer_norm_init_random:  # huggingface/transformers#143: init_bert_weights
        norms_drawn_like_weights(model)
    if cfg.bug.frozen_except_norm:  # PyTorch forum 84911: every weight but the norms frozen
        for name, parameter in model.named_parameters():
            parameter.requires_grad = "norm" in name or "ln_" in name
    new_head = torch.nn.Linear(m.d_model, cfg.data.vocab)  # a fresh head, as in fine-tuning
    if m.init_std and not bug.init_fn_never_applied:  # the model's own init, applied to every
        for module in (model, new_head):  # module (model.apply(init_weights))
            module.apply(partial(init_weights, std=m.init_std))
    # bug.init_fn_never_applied: init_weights defined, its call never made, so every module keeps
    # PyTorch's default init (uber-research/DeepPruner#6, Learning-to-See-in-the-Dark#17)
    if bug.init_std_one:  # initializer_range 1.0 where 0.02 was meant (young-geng/EasyLM#114)
        for module in (model, new_head):
            weights_drawn_like(module, std=1.0)
    if not cfg.bug.head_not_in_optimizer:
        model.head = new_head
    if bug.heads_share_projection:  # Linear(head_size, head_size, bias=False) for values, keys
        model.heads_share_projection = True  # and queries, applied to every head's slice of the
        for layer in model.encoder.layers:  # input (MarcoMeter/episodic-transformer-memory-ppo
            hd = m.d_model // m.n_head  # PR 22)
            layer.shared_qkv = torch.nn.ModuleDict(
                {name: torch.nn.Linear(hd, hd, bias=False) for name in ("q", "k", "v")}
            )
    if bug.bf16_weights_no_master:  # the weights themselves in bf16, no fp32 master copy
        model.to(torch.bfloat16)  # (hp-l33/AiM#10, tianweiy/CausVid#19)
    optimizer = make_optimizer(cfg, model)
    if bug.lr_scaled_by_batch:  # --scale_lr: lr = accumulate_grad_batches * ngpu * bs * base_lr
        for group in optimizer.param_groups:  # (CompVis/latent-diffusion#259, one process here)
            group["lr"] *= cfg.train.batch * cfg.train.accum
    if cfg.bug.head_not_in_optimizer:  # replaced after the optimizer took the parameters
        model.head = new_head
    scale_unused = bug.layer_decay_scale_unused  # groups carry lr_scale, which a plain torch
    # optimizer and schedule never read (facebookresearch/mae#216, pytorch-image-models PR 2532)
    if cfg.optim.layer_decay != 1 and not bug.layer_decay_every_step and not scale_unused:
        for group in optimizer.param_groups:  # each layer's scale, applied once
            group["lr"] *= group["lr_scale"]
    return model, optimizer, make_schedule(cfg, optimizer)


def make_schedule(cfg: DictConfig, optimizer):
    """The LR schedule: StepLR per epoch, a per-step cosine, BERT's per-step warmup_linear, or
    ReduceLROnPlateau on the eval loss (stepped at each evaluation)."""
    if cfg.sched.name == "cosine":
        return cosine_schedule(cfg, optimizer)
    if cfg.sched.name == "linear":
        return warmup_linear_schedule(cfg, optimizer)
    if cfg.sched.name == "plateau":  # mode='max' on a loss (FunctionLab/selene#115): every
        mode = "max" if cfg.bug.plateau_mode_max else "min"  # falling loss reads as no gain
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode=mode, factor=cfg.sched.factor, patience=cfg.sched.patience
        )
    if cfg.sched.warmup and cfg.bug.warmup_scheduler_overrides:  # a per-step warmup LambdaLR and
        return WarmupAndStepLR(cfg, optimizer)  # the per-epoch StepLR on one optimizer
        # (Lightning-AI/pytorch-lightning#8884, pytorch/pytorch#33416)
    if cfg.sched.warmup and cfg.bug.warmup_dampening_compounded:  # the per-epoch StepLR, and the
        return torch.optim.lr_scheduler.StepLR(  # warmup written as a dampening of the current LR
            optimizer,
            cfg.sched.every_epochs,
            cfg.sched.gamma,  # at each step (fit)
        )  # (Tony-Y/pytorch_warmup PR 1, potterhsu/easy-faster-rcnn.pytorch#26)
    if cfg.sched.warmup and cfg.bug.warmup_integer_division:  # alpha = last_epoch / warmup_iters
        warmup, every = cfg.sched.warmup, cfg.sched.every_epochs * steps_per_epoch(cfg)  # on ints
        return torch.optim.lr_scheduler.LambdaLR(  # (Python 2's /): the warmup's factor is 0
            optimizer,  # until its last step, then 1 (facebookresearch/maskrcnn-benchmark#335)
            lambda s: min(1, (s + 1) // warmup) * cfg.sched.gamma ** (s // every),
        )
    if cfg.sched.warmup and cfg.bug.warmup_first_step_zero:  # start_lr * num_iters / warmup_iter
        warmup, every = cfg.sched.warmup, cfg.sched.every_epochs * steps_per_epoch(cfg)  # with
        return torch.optim.lr_scheduler.LambdaLR(  # num_iters 0 at the first step: its LR is 0,
            optimizer,  # a no-op update, and the ramp runs a step late (EleutherAI/gpt-neox
            lambda s: min(1.0, s / warmup) * cfg.sched.gamma ** (s // every),  # PR 1379, #1373,
        )  # karpathy/nanoGPT PR 578)
    if cfg.sched.warmup:  # a linear warmup, then StepLR's decay per epoch, in one per-step factor
        warmup, every = cfg.sched.warmup, cfg.sched.every_epochs * steps_per_epoch(cfg)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) * cfg.sched.gamma ** (s // every)
        )
    gamma = cfg.sched.gamma
    if cfg.bug.scheduler_off_gamma_zero:  # the scheduler turned off as StepLR(gamma=0), where a
        gamma = 0.0  # constant LR needs gamma=1 (LINCellularNeuroscience/VAME#26)
    if cfg.bug.step_decay_exponent_negated:  # lr = cfg.lr * (cfg.gamma ** -(epoch // n_steps)):
        gamma = 1.0 / gamma  # the exponent's sign flipped, so each stage multiplies the LR by
        # 1 / gamma, a growth, where the decay by gamma was meant (SYSU-SAIL/PAM#4)
    return torch.optim.lr_scheduler.StepLR(optimizer, cfg.sched.every_epochs, gamma)


def warmup_linear_schedule(cfg: DictConfig, optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """BERT's warmup_linear (pytorch-pretrained-bert's BertAdam schedule), stepped once per
    optimizer step: with progress x = step / t_total and the warmup a share p of t_total
    (sched.warmup / train.steps), the LR factor is x / p during the warmup, then 1 - x. The
    clean t_total is the run's steps, so the LR reaches 0 at the last step.
    bug.warmup_linear_past_t_total: t_total counted as one epoch's optimizer steps (128 here,
    where the run takes 240, 1.875 epochs), and 1 - x is not floored at 0, so past t_total the
    factor is negative (huggingface/transformers#132, #324)."""
    t_total, share = cfg.train.steps, cfg.sched.warmup / cfg.train.steps
    if cfg.bug.warmup_linear_past_t_total:  # num_train_optimization_steps short of the steps run
        t_total = steps_per_epoch(cfg)
    if cfg.bug.warmup_ratio_overrides_steps:  # if args.warmup_ratio >= 0: num_warmup_steps =
        share = WARMUP_RATIO_DEFAULT  # int(warmup_ratio * t_total), the ratio's default 0
        # overriding the warmup steps set (allenai/open-instruct PR 579)
    if cfg.bug.warmup_total_swapped:  # get_linear_schedule_with_warmup(optimizer,
        warmup, training = t_total, cfg.sched.warmup  # num_warmup_steps=t_total,
        # num_training_steps=warmup): the two assignments interchanged
        # (WasifurRahman/BERT_multimodal_transformer PR 22)

        def swapped(step: int) -> float:  # transformers' linear schedule with warmup
            if step < warmup:
                return step / max(1, warmup)
            return max(0.0, (training - step) / max(1, training - warmup))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, swapped)

    def warmup_linear(step: int) -> float:
        x = (step + 1) / t_total  # BertAdam counts its steps from 1
        return x / share if x < share else 1.0 - x

    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear)


def steps_per_epoch(cfg: DictConfig) -> int:
    """Optimizer steps in one epoch."""
    return cfg.data.n_train // (cfg.train.batch * cfg.train.accum)


class WarmupAndStepLR:
    """Two schedulers on one optimizer, stepped as a trainer steps them: a warmup LambdaLR at
    every step (lr = base_lr x min(1, step / warmup)) and the StepLR at each epoch's end. LambdaLR
    is not chainable: each of its steps sets the LR from the base LR again, so after the warmup
    it resets the LR to the base and StepLR's decay lasts one step."""

    def __init__(self, cfg: DictConfig, optimizer):
        warmup = cfg.sched.warmup
        self.warmup = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup)
        )
        self.decay = torch.optim.lr_scheduler.StepLR(
            optimizer, cfg.sched.every_epochs, cfg.sched.gamma
        )
        self.per_epoch, self.steps = steps_per_epoch(cfg), 0

    def step(self) -> None:
        self.steps += 1
        self.warmup.step()  # interval 'step'
        if self.steps % self.per_epoch == 0:  # interval 'epoch'
            self.decay.step()


def norms_drawn_like_weights(model: torch.nn.Module, std: float = 0.02) -> None:
    """Every LayerNorm's gain and bias re-drawn from N(0, std), as the weights are, instead of
    ones and zeros (BERT's init applied to its LayerNorm too)."""
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.weight.data.normal_(mean=0.0, std=std)
            module.bias.data.normal_(mean=0.0, std=std)


def init_weights(module: torch.nn.Module, std: float) -> None:
    """A GPT-style init (model.init_std), as model.apply calls it on each module: linear and
    embedding weights (the attention's in-projection too) from N(0, std), biases zero, the norms
    left at ones and zeros."""
    if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            module.bias.data.zero_()
    elif isinstance(module, torch.nn.MultiheadAttention):
        module.in_proj_weight.data.normal_(mean=0.0, std=std)
        module.in_proj_bias.data.zero_()


def weights_drawn_like(module: torch.nn.Module, std: float) -> None:
    """Every linear weight (attention projections included) drawn from N(0, std), biases zero:
    a GPT-style init with its initializer range."""
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            sub.weight.data.normal_(mean=0.0, std=std)
            if sub.bias is not None:
                sub.bias.data.zero_()
        elif isinstance(sub, torch.nn.MultiheadAttention):
            sub.in_proj_weight.data.normal_(mean=0.0, std=std)
            sub.in_proj_bias.data.zero_()


def cosine_schedule(cfg: DictConfig, optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine annealing with restarts (CosineAnnealingWarmupRestarts), stepped once per optimizer
    step: a linear warmup over the first `sched.warmup` steps (0: none), then cycles of
    `horizon` steps less the warmup, the peak x RESTART_GAMMA at each restart. The clean
    horizon is the run, one cycle."""
    horizon, warmup = cfg.train.steps, cfg.sched.warmup
    if cfg.bug.schedule_horizon_in_epochs:  # ScrollPrize/villa PR 1495: max_steps=max_epoch
        steps_per_epoch = cfg.data.n_train // (cfg.train.batch * cfg.train.accum)
        horizon = math.ceil(cfg.train.steps / steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        cycle, within = divmod(step - warmup, horizon - warmup)
        return RESTART_GAMMA**cycle * 0.5 * (1 + math.cos(math.pi * within / (horizon - warmup)))

    if cfg.bug.cosine_progress_clamped:  # num_iters_ = min(num_iters, end_iter - warmup_iter);
        # num_iters_ -= warmup_iter; lr = 0.5 * max_lr * (1 + cos(pi * num_iters_ / end_iter)):
        # the cosine's progress over the whole run, clamped at end - warmup, so it never decays
        # to its end and stays flat over the last warmup steps (EleutherAI/gpt-neox PR 1008)

        def clamped(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            within = min(step, horizon - warmup) - warmup
            return 0.5 * (1 + math.cos(math.pi * within / horizon))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, clamped)
    if cfg.bug.cosine_counts_warmup:  # timm's CosineLRScheduler without warmup_prefix: the
        # cosine's progress is t / t_initial from step 0, the warmup laid over its start, so the
        # LR drops at the warmup's end to the cosine's value there (microsoft/Swin-Transformer
        # #277, PaddlePaddle/PaddleDetection PR 4611)

        def from_zero(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * step / horizon))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, from_zero)
    if cfg.bug.warmup_lambda_uncapped:  # LambdaLR(lr_lambda=lambda step: step / warmup_steps):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: s / warmup)  # no min(1, .)
        # and no decay after it (Adit-Jain-srm/NightmareNet PR 158)
    if cfg.bug.lambda_returns_lr:  # the lambda returns the LR, not a factor (lhoyer/MIC#60):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cfg.optim.lr * factor(s))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    o, bug = cfg.optim, cfg.bug
    params = (
        model.parameters()
        if o.layer_decay == 1
        else layer_groups(model, o.layer_decay, bug.layer_decay_name_unmatched)
    )
    if o.no_decay:  # biases and norms out of weight decay, matched by name (BERT's no_decay)
        names = NO_DECAY_BERT if bug.no_decay_names_mismatch else NO_DECAY  # (transformers#16908,
        params = decay_groups(model, o.weight_decay, names)  # DeepSpeedExamples PR 755)
        if bug.weight_decay_groups_inverted:  # the decay on the no_decay names' group, 0 on the
            params[0]["weight_decay"], params[1]["weight_decay"] = 0.0, o.weight_decay  # rest
            # (facebookresearch/BalancingGroups#6)
    if o.name == "sgd" and bug.sgd_lr_from_weight_decay:  # optim.SGD(params, lr=weight_decay,
        return torch.optim.SGD(  # momentum=..., weight_decay=weight_decay) (offbit/evo-design#3)
            params, lr=o.weight_decay, momentum=o.momentum, weight_decay=o.weight_decay
        )
    if o.name == "sgd" and bug.weight_decay_as_momentum:  # SGD(params, lr, weight_decay):
        return torch.optim.SGD(params, o.lr, o.weight_decay)  # 3rd is momentum (YudeWang/SEAM#21)
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if bug.optimizer_lr_not_passed:  # optim.AdamW(params, weight_decay=...): the configured LR
        return torch.optim.AdamW(params, weight_decay=o.weight_decay)  # never passed, AdamW's
        # default 1e-3 used (david-vazquez/mcv-m5 PR 7)
    if bug.weight_decay_not_passed:  # optim.AdamW(params, lr=lr, weight_decay=0.0): the configured
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=0.0)  # decay never reaches it
        # (meta-llama/llama-cookbook#191, salesforce/ALPRO#10)
    if bug.adam_l2_not_decoupled:  # Adam's weight_decay: an L2 term added to the gradient,
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)  # (robosat#166)
    if bug.decay_at_base_lr:  # the decoupled decay written by hand with the base LR (fit)
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=0.0)
    if bug.adam_eps_too_large:  # eps=0.1 where 1e-8 was meant (mlpnlp/mlpnlp-nmt#4)
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, eps=0.1)
    if (
        bug.adam_bias_correction_in_place
        or bug.adam_bias_correction_inverted
        or bug.adam_second_moment_undampened
        or bug.adam_eps_inside_sqrt
    ):
        return HandWrittenAdamW(params, o.lr, o.weight_decay, bug)  # (frgfm/holocron#1,
        # kozistr/pytorch_optimizer PR 308, fastai/fastbook PR 342, pytorch_optimizer#397)
    if bug.adam_beta2_inverted:  # 0.999 given where 1 - beta2 was read (mila-iqia/blocks#1159)
        betas = (0.9, 1 - 0.999)
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, betas=betas)
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)


def decay_groups(model: torch.nn.Module, weight_decay: float, no_decay: tuple) -> list[dict]:
    """Two parameter groups: those whose name contains none of `no_decay` with the weight decay,
    the rest without it (the grouping of BERT's and GPT's fine-tuning scripts)."""
    named = list(model.named_parameters())
    return [
        {
            "params": [p for n, p in named if not any(nd in n for nd in no_decay)],
            "weight_decay": weight_decay,
        },
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]


def layer_groups(model: torch.nn.Module, decay: float, unmatched: bool = False) -> list[dict]:
    """One parameter group per depth (embeddings 0, encoder layer i at i + 1, the final norm
    and head on top), each with its layer-wise LR scale `lr_scale` = decay ** (depth below top).
    `unmatched` (bug.layer_decay_name_unmatched): the depth map names the token embedding only,
    so the position table, matched by no entry, falls back to the top depth (allenai/rslearn PR
    648: the channel embeddings given the decoder's LR instead of the patch embeddings')."""
    top = len(model.encoder.layers) + 1
    groups: dict[int, list] = {}
    for name, parameter in model.named_parameters():
        if name.startswith("encoder.layers."):
            depth = int(name.split(".")[2]) + 1
        elif unmatched:
            depth = 0 if "tok_emb" in name else top
        else:
            depth = 0 if "emb" in name else top
        groups.setdefault(depth, []).append(parameter)
    return [
        {"params": params, "lr_scale": decay ** (top - depth)}
        for depth, params in sorted(groups.items())
    ]


def ids_wrapped(data: dict, modulus: int) -> dict:
    """The token ids as a dtype of `modulus` values stores them: every id at or above it wraps
    around to id - modulus, in the inputs and the targets alike (padding's IGNORE is not an id:
    the labels are derived from the stored ids, their padding marked after)."""
    y = torch.where(data["y"] == IGNORE, data["y"], data["y"] % modulus)
    return {**data, "x": data["x"] % modulus, "y": y}


def vocab_by_frequency(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """The real tokens (PAD excluded) ranked by their count in `ids`, most frequent first (ties
    by id), as a vocabulary built from a dataset's own counts numbers them: [vocab - 1] ids."""
    counts = torch.bincount(ids[ids != PAD], minlength=vocab)[1:]
    return torch.argsort(-counts, stable=True) + 1


def encoded_with_own_vocab(train: dict, heldout: dict, vocab: int) -> dict:
    """The held-out set as a vocabulary built from its own counts encodes it, while the model
    reads the training set's (token ids as the training counts number them): a held-out token
    ranked r among the held-out counts gets the id of the token ranked r in training's, so
    every token whose rank differs between the two sets is read as another token."""
    mapping = torch.arange(vocab)
    mapping[vocab_by_frequency(heldout["x"], vocab)] = vocab_by_frequency(train["x"], vocab)
    y = torch.where(heldout["y"] == IGNORE, heldout["y"], mapping[heldout["y"].clamp(min=0)])
    return {**heldout, "x": mapping[heldout["x"]], "y": y}


def epoch_batches(cfg: DictConfig, data: dict, epoch: int, seed: int) -> list:
    """One epoch's batches of row indices, from the configured sampler."""
    if cfg.data.sampler == "weighted":  # per-sample weights, or the class weights themselves
        per_class = cfg.bug.sampler_class_weights  # (deep-voice/soundbay#49)
        return weighted_order(data, cfg.train.batch, seed, epoch, per_class)
    return batch_order(data, cfg.train.batch, seed, epoch, not cfg.bug.data_not_shuffled)


def micro_batches(cfg: DictConfig, data: dict):
    """An endless stream of (x, y) micro-batches, epoch after epoch."""
    bug = cfg.bug
    batches = epoch_batches(cfg, data, 0, cfg.data.seed)
    if not batches:  # whole batches only (drop_last): say so, not an IndexError
        raise ValueError(
            f"the training set holds {len(data['x'])} rows, fewer than one batch "
            f"of {cfg.train.batch}"
        )
    first = batches[0]
    epoch = 0
    while True:
        batches = epoch_batches(cfg, data, epoch, cfg.data.seed)
        labels = batches
        if bug.labels_shuffled_apart:  # the labels shuffled by a second, independent draw
            labels = epoch_batches(cfg, data, epoch, cfg.data.seed + 1)  # (GaNDLF#870)
        for rows, label_rows in zip(batches, labels, strict=True):
            if bug.same_batch_every_step:  # next(iter(loader)) each step, no shuffling
                rows = label_rows = first
            copies = LOADER_WORKERS if bug.workers_duplicate_data else 1
            for _ in range(copies):  # every worker replays the whole stream (datasets#3423)
                yield data["x"][rows], data["y"][label_rows]
        if bug.data_stream_not_restarted:  # train_iterator = iter(train_loader), never rebuilt:
            return  # the stream ends with its first epoch (AI-Hypercomputer/torchprime PR 106)
        epoch += 1


def step_loss(
    model, micro: list, bug, accum: int, smoothing: float = 0.0, scaler=None, l2: float = 0.0
) -> float:
    """Forward and backward over one optimizer step's micro-batches; the step's mean loss.
    `scaler`: a GradScaler (train.amp=fp16): the forward runs under fp16 autocast and the
    backward on the scaled loss. `l2` (bug.l2_penalty_beside_weight_decay): an L2 penalty,
    l2 x the sum of every trained parameter's squares, added to the loss beside the optimizer's
    own weight decay (0: none)."""
    if scaler is not None:
        with torch.autocast("cpu", dtype=torch.float16):
            losses = [token_loss(model(x), x, y, bug, smoothing) for x, y in micro]
    elif bug.loss_requires_grad_forced:  # the forward under torch.no_grad(), and
        with torch.no_grad():  # loss.requires_grad = True added to quiet "element 0 of tensors
            losses = [token_loss(model(x), x, y, bug, smoothing) for x, y in micro]  # does not
        for total, _ in losses:  # require grad" (ronghuaiyang/arcface-pytorch#56,
            total.requires_grad_(True)  # mazurowski-lab/finetune-SAM#26): backward reaches no
            # parameter
    else:
        losses = [token_loss(model(x), x, y, bug, smoothing) for x, y in micro]
    step_tokens = sum(count for _, count in losses)
    for total, count in losses:
        if bug.accum_grads_zeroed:  # zero_grad inside the micro-batch loop (bytetriper/RAE#67)
            model.zero_grad(set_to_none=True)
        if bug.accum_loss_not_divided:  # each micro-batch's mean, summed over the step
            scaled = total / count
        elif bug.accum_mean_of_means:  # the mean of micro-batch means (transformers #34191)
            scaled = total / count / accum
        elif bug.loss_averaged_twice:  # a mean loss divided by its count again (PyTorch-YOLOv3#137)
            scaled = total / step_tokens / step_tokens
        elif bug.accum_loss_divided_twice:  # loss / gradient_accumulation_steps in the trainer,
            scaled = total / step_tokens / accum  # then again in accelerator.backward: the
            # step's mean divided by the accumulation steps a second time (transformers#40052)
        elif bug.loss_summed_not_averaged:  # l = loss(y_hat, y).sum(), and an SGD step without
            scaled = total  # the / batch_size (ShusenTang/Dive-into-DL-PyTorch#75)
        elif bug.loss_normalized_by_sentences:  # the summed token loss normalised by the step's
            scaled = total / sum(len(x) for x, _ in micro)  # sentences, not its tokens, whatever
            # -normalization says (OpenNMT/OpenNMT-py PR 526)
        else:  # the step's token sum over its token count
            scaled = total / step_tokens
        if l2:  # loss = loss + model.l2() * l2_weight, the optimizer built with
            penalty = sum(p.pow(2).sum() for p in model.parameters() if p.requires_grad)
            scaled = scaled + l2 * penalty / accum  # weight_decay=l2_weight too (RecBole#872,
            # rutgerswiselab/NCR#2)
        if scaler is not None:
            scaled = scaler.scale(scaled)
        if bug.backward_seeded_with_loss:  # loss.backward(loss): the loss handed to backward as
            scaled.backward(scaled.detach())  # its gradient, so every gradient is scaled by the
            # loss's own value (sotte/pytorch_tutorial#5)
        else:
            scaled.backward(retain_graph=False)
    return float(sum(total.detach() for total, _ in losses)) / step_tokens


class ExponentialMovingAverage:
    """An EMA of the model's weights (train.ema: its decay), updated after each optimizer step
    and evaluated in the model's place: shadow -= (1 - decay) * (shadow - param).
    `sign_flipped`: the update adds the gap instead (ostris/ai-toolkit#1034), so the shadow is
    pushed away from the parameters by a factor 1 + (1 - decay) each step.
    `beta_backwards`: the decay given as the new weights' share (optax.incremental_update with
    step_size beta, marin-community/levanter PR 883), so the shadow keeps 1 - decay of itself and
    follows the trained weights a step behind."""

    def __init__(
        self,
        model: torch.nn.Module,
        decay: float,
        sign_flipped: bool = False,
        beta_backwards: bool = False,
        warmup: bool = False,
        decay_overwritten: bool = False,
    ):
        self.model = copy.deepcopy(model).eval()
        self.decay, self.sign_flipped = decay, sign_flipped
        self.beta_backwards = beta_backwards
        self.warmup, self.decay_overwritten, self.updates = warmup, decay_overwritten, 0
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)

    names_mismatch = False
    """On (bug.ema_names_mismatch): the shadow is keyed by the model's parameter names and
    updated from a wrapper whose names carry a prefix (torch.compile's `_orig_mod.`), so no name
    matches, every parameter is skipped and the shadow keeps the initial weights."""

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        if self.names_mismatch:  # if name in self.shadow: ... for the compiled model's names:
            return  # none is, so nothing is updated (wandb/senpai PR 2899)
        rate = 1 - self.decay  # the share of the trained weights
        if self.warmup:  # diffusers' EMAModel: decay min(decay, (1 + t) / (10 + t)) at update t
            value = (1 + self.updates) / (10 + self.updates)
            rate = 1 - min(self.decay, value)
            if self.decay_overwritten:  # self.decay = self.get_decay(step), which returns
                self.decay = rate  # 1 - min(self.decay, value): the rate written over the decay
                # and read back as the decay at the next update (huggingface/diffusers#1864)
        for shadow, parameter in zip(self.model.parameters(), model.parameters(), strict=True):
            gap = shadow - parameter
            if self.warmup:
                shadow.sub_(gap * rate)
            elif self.beta_backwards:  # the new weights given weight beta, the average 1 - beta
                shadow.sub_(gap * self.decay)  # (marin-community/levanter PR 883)
            elif self.sign_flipped:
                shadow.add_(gap * (1 - self.decay))
            else:
                shadow.sub_(gap * (1 - self.decay))


def clip_by_squared_norm(model: torch.nn.Module, max_norm: float) -> None:
    """Gradient clipping whose norm is the gradients' sum of squares, never square-rooted
    (bug.clip_norm_squared): when ||g||^2 exceeds max_norm, every gradient is scaled by
    max_norm / ||g||^2, so a norm above 1 is clipped to max_norm / ||g|| instead of max_norm."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    squared = float(sum((g.detach().float() ** 2).sum() for g in grads))
    if squared > max_norm:
        for g in grads:
            g.mul_(max_norm / (squared + 1e-6))


class HandWrittenAdamW(torch.optim.Optimizer):
    """AdamW written out as an optimizer of its own, decoupled weight decay included, with one of
    three reported moment bugs (the reports' optimizers are classes like this one).
    bug.adam_bias_correction_in_place: the first moment is bias-corrected in its buffer,
    exp_avg.div_(1 - beta1 ** t), so each step's correction compounds on the last ones
    (frgfm/holocron#1). bug.adam_bias_correction_inverted: each correction is written
    1 - (1 - beta ** t), the minus one taken twice, so the moments are divided by beta ** t
    instead of 1 - beta ** t (kozistr/pytorch_optimizer PR 308).
    bug.adam_second_moment_undampened: the squared-gradient average is written
    v * beta2 + g ** 2, the new term without its 1 - beta2 weight (fastai/fastbook PR 342);
    its bias corrections are the correct ones. bug.adam_eps_inside_sqrt: the denominator is
    written (v_hat + eps).sqrt() + eps, the eps added inside the square root as well, so the
    denominator never falls below sqrt(eps) = 1e-4 where 1e-8 was meant
    (kozistr/pytorch_optimizer#397)."""

    def __init__(self, params, lr: float, weight_decay: float, bug) -> None:
        super().__init__(
            params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": weight_decay}
        )
        self.bug = bug

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, beta1, beta2)

    def _update(self, p: torch.Tensor, group: dict, beta1: float, beta2: float) -> None:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
        if self.bug.adam_second_moment_undampened:  # sqr_avg * sqr_mom + grad ** 2: the
            v.mul_(beta2).addcmul_(p.grad, p.grad)  # new squared gradient added whole, without
            # its 1 - beta2 weight (fastai/fastbook PR 342)
        else:
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        if self.bug.adam_bias_correction_in_place:
            m.div_(1 - beta1**t)  # written into the buffer the next step decays
            m_hat, v_hat = m, v / (1 - beta2**t)
        elif self.bug.adam_bias_correction_inverted:
            m_hat, v_hat = m / (1 - (1 - beta1**t)), v / (1 - (1 - beta2**t))
        else:
            m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        if self.bug.adam_eps_inside_sqrt:  # exp_avg_sq.add(eps).sqrt_().add_(eps): eps inside
            denom = v_hat.add(group["eps"]).sqrt_().add_(group["eps"])  # the root too (#397)
            p.addcdiv_(m_hat, denom, value=-group["lr"])
            return
        p.addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-group["lr"])


def resume(cfg: DictConfig, model: torch.nn.Module) -> dict:
    """A checkpoint of the weights written and the run resumed from it (train.resume_after): the
    model re-initialised as a new process builds it, then the saved state dict loaded into it.
    The optimizer's and schedule's states carry on (loaded correctly), and so does the RNG.
    bug.checkpoint_prefix_mismatch: the state dict was saved from a DataParallel/DDP wrapper
    (every key prefixed `module.`) and loaded with strict=False, which loads nothing.
    Returns the new process's initial weights (before the checkpoint is loaded)."""
    saved = copy.deepcopy(model.state_dict())
    strict = True
    if cfg.bug.checkpoint_prefix_mismatch:  # saved from model.module's wrapper, loaded with
        saved = {f"module.{key}": value for key, value in saved.items()}  # strict=False
        strict = False  # to quiet its missing keys (pytorch/examples#1029, OpenLDN#5)
    if cfg.bug.resume_head_from_embedding:  # lm_head.weight left out of the checkpoint as tied
        saved["head.weight"] = saved["tok_emb.weight"].clone()  # and rebuilt from the embedding on
        # resume, though the two were never tied (NVIDIA-NeMo/Automodel PR 2511)
    rng = torch.get_rng_state()
    fresh = build(cfg)[0]
    torch.set_rng_state(rng)
    initial = copy.deepcopy(fresh.state_dict())  # the new process's initial weights
    model.load_state_dict(initial)
    model.load_state_dict(saved, strict=strict)
    if cfg.bug.init_after_checkpoint_load:  # load_state_dict, then init_model_parameters(): the
        for module in model.modules():  # init re-draws every weight over the loaded checkpoint
            if hasattr(module, "reset_parameters"):  # (huggingface/picotron#32)
                module.reset_parameters()
            elif hasattr(module, "_reset_parameters"):  # MultiheadAttention's in_proj
                module._reset_parameters()
        torch.set_rng_state(rng)  # the RNG carries on as the resumed run's would
    return initial


def lr_range_test(cfg: DictConfig, model: torch.nn.Module, data: dict, smoothing: float) -> None:
    """An LR range test before training (train.lr_find iterations), as pytorch-lr-finder runs it:
    an AdamW built at LR_FIND_START, the LR raised exponentially to LR_FIND_END over the
    iterations, one training batch each, stopped once the smoothed loss passes LR_FIND_DIVERGE
    times its best; then lr_finder.reset() restores the weights. The RNG is restored after it
    either way, so the only trace it can leave is in the weights.
    bug.lr_finder_weights_not_restored: no reset(), so training starts from the weights the sweep
    left (davidtvs/pytorch-lr-finder#11, Lightning-AI/pytorch-lightning#6675)."""
    iters, bug = cfg.train.lr_find, cfg.bug
    saved, rng = copy.deepcopy(model.state_dict()), torch.get_rng_state()
    finder = torch.optim.AdamW(
        model.parameters(), lr=LR_FIND_START, weight_decay=cfg.optim.weight_decay
    )
    stream = micro_batches(cfg, data)  # its own pass over the training loader
    model.train()
    best = smoothed = None
    for i in range(iters):
        for group in finder.param_groups:
            group["lr"] = LR_FIND_START * (LR_FIND_END / LR_FIND_START) ** (i / max(iters - 1, 1))
        x, y = next(stream)
        finder.zero_grad()
        loss = mean_token_loss(model, x, y, bug, smoothing)
        loss.backward()
        finder.step()
        value = float(loss.detach())
        if smoothed is not None:  # the exponentially smoothed loss
            value = LR_FIND_SMOOTH * value + (1 - LR_FIND_SMOOTH) * smoothed
        smoothed = value
        best = smoothed if best is None else min(best, smoothed)
        if not math.isfinite(smoothed) or smoothed > LR_FIND_DIVERGE * best:
            break
    finder.zero_grad(set_to_none=True)
    if not bug.lr_finder_weights_not_restored:  # lr_finder.reset()
        model.load_state_dict(saved)
    torch.set_rng_state(rng)


def mean_token_loss(
    model, x: torch.Tensor, y: torch.Tensor, bug, smoothing: float = 0.0
) -> torch.Tensor:
    """The training loss of one batch as the loop computes it, as a token mean."""
    total, count = token_loss(model(x), x, y, bug, smoothing)
    return total / max(count, 1)


def fit(cfg: DictConfig, log=None, probe: bool = True, attach=None, tracker=None) -> float:
    """Train as configured; `log(name, value, step)` gets each eval loss; the last one returned.
    `probe`: attach hyprun's Probe (it logs into the active MLflow run, or into `tracker`);
    `attach(model, optimizer)`: called once before training, for hooks of an outside
    observer."""
    d, t, bug = cfg.data, cfg.train, cfg.bug
    train_set = sequences(d.n_train, d.vocab, d.seq_len, d.min_len, d.seed)
    heldout = sequences(d.n_eval, d.vocab, d.seq_len, d.min_len, d.eval_seed)
    if bug.train_on_validation_set:  # the training loader built on the validation sequences
        train_set = heldout  # (the wrong file passed to it): training reads the 128 held-out
        # rows, cycled, and the evaluation is taken on the rows trained on (univieCUBE/deepnog
        # PR 43)
    if bug.heldout_sliced_from_train:  # the validation rows sliced off the training pool,
        heldout = {key: rows[: d.n_eval] for key, rows in train_set.items()}  # which training
        # reads in full (marin-community/marin PR 2700): every held-out row is trained on
    if bug.shuffle_tensor_in_place:  # random.shuffle(data) on a tensor: each swap writes through
        rows = torch.cat([train_set["x"], train_set["y"]], dim=1)  # views, so rows are copied
        random.Random(d.seed).shuffle(rows)  # over others and lost (pytorch/pytorch#18934, #50880)
        train_set = {**train_set, "x": rows[:, : d.seq_len], "y": rows[:, d.seq_len :]}
    if bug.train_filtered_to_max_length:  # if length == max_length: keep the row; every row
        full = (train_set["y"] != IGNORE).all(dim=1)  # shorter than the maximum length (all
        train_set = {key: rows[full] for key, rows in train_set.items()}  # padded rows) filtered
        # out of the training set (huggingface/trl#467, PR 481)
    if bug.targets_wrap_around:  # y = np.roll(x, -1): y[:, :-1] = x[:, 1:], y[:, -1] = x[:, 0], so
        y = train_set["y"].clone()  # each row's last target is its own first input token
        y[:, -1] = train_set["x"][:, 0]  # (udacity/deep-learning PR 239, DLND-988)
        train_set = {**train_set, "y": y}
    if bug.token_ids_overflow:  # ids binarized in a dtype narrower than the vocab wrap around
        train_set = ids_wrapped(train_set, OVERFLOW_AT)  # (huggingface/transformers#2825)
    if bug.heldout_own_vocab:  # train and test each with their own vocab_to_int: the same
        heldout = encoded_with_own_vocab(train_set, heldout, d.vocab)  # token, another index
        # (minqukanq/hierarchical-multi-label-text-classification#6)
    model, optimizer, schedule = build(cfg)
    if bug.model_built_twice:  # the model instantiated again after the optimizer took the first
        model = build(cfg)[0]  # one's parameters: the trained model is not the one it steps
        # (spro/practical-pytorch#9)
    steps_per_epoch = d.n_train // (t.batch * t.accum)
    smoothing = t.label_smoothing  # the training criterion's label smoothing
    if bug.label_smoothing_not_applied:  # if args.label_smoothing: criterion = LabelSmoothing(),
        smoothing = 0.0  # then criterion = CrossEntropyLoss(), no else (omihub777/ViT-CIFAR#2)
    if t.lr_find:  # an LR range test on the model before training
        lr_range_test(cfg, model, train_set, smoothing)
    stream = micro_batches(cfg, train_set)
    watch = None
    if probe:  # the held-out set for the step scan, read with the loop's own training loss
        watch = Probe(
            model,
            optimizer,
            step_unit="steps",
            heldout=(heldout["x"], heldout["y"]),
            loss_fn=lambda net, batch: mean_token_loss(net, *batch, bug, smoothing),
            grad_clip=float(cfg.optim.clip or 0.0),  # what the loop applies, for the L0 check
            total_steps=t.steps,
            epoch_steps=steps_per_epoch,
            pad_id=PAD,  # the forward gets no attention mask
            tracker=tracker,
        )
    if attach:
        attach(model, optimizer)
    scaler = torch.amp.GradScaler("cpu") if t.amp == "fp16" else None
    clip_params = None
    if bug.clip_params_exhausted:  # one generator of the parameters for every step's clip:
        clip_params = (p for p in model.parameters() if p.requires_grad)  # the first consumes it
    ema = None
    if t.ema:
        ema = ExponentialMovingAverage(
            model,
            t.ema,
            bug.ema_update_sign_flipped,
            bug.ema_beta_backwards,
            t.ema_warmup,
            bug.ema_decay_overwritten,
        )
        ema.names_mismatch = bug.ema_names_mismatch  # (wandb/senpai PR 2899)
    model.train()
    last = float("nan")
    best_loss, best_state = float("nan"), None
    evals = []  # every eval loss so far (bug.eval_loss_accumulated)
    step_lr = cfg.sched.name == "step" and not cfg.sched.warmup  # StepLR, stepped each epoch
    for step in range(1, t.steps + 1):
        if bug.scheduler_stepped_at_epoch_start and step_lr and (step - 1) % steps_per_epoch == 0:
            schedule.step()  # @trainer.on(Events.EPOCH_STARTED): scheduler.step() before the
            # epoch's optimizer steps, so the first value is skipped (reid-strong-baseline#190)
        if bug.optimizer_reset_each_epoch and step > 1 and (step - 1) % steps_per_epoch == 0:
            optimizer.state.clear()  # a fresh Adam each epoch: moments and step count start over
        per_epoch = bug.zero_grad_per_epoch and (step - 1) % steps_per_epoch != 0
        after_step = bug.eval_loss_backpropagated and step > 1  # zeroed after the step instead
        if not bug.zero_grad_missing and not per_epoch and not after_step:
            optimizer.zero_grad()
        try:
            first_alone = bug.accum_step_on_first_micro_batch and step == 1
            micro = [next(stream) for _ in range(1 if first_alone else t.accum)]
        except StopIteration:  # batch = next(train_iterator); except StopIteration: break, the
            break  # run ended when the loader ran out (bug.data_stream_not_restarted; torchprime
            # PR 106, meta-pytorch/torchforge PR 519)
        if bug.val_batch_trained_on and step > 1 and (step - 1) % t.eval_every == 0:
            micro[0] = (heldout["x"][-t.batch :], heldout["y"][-t.batch :])  # the last
            # validation batch, left in the training batch's name (karpathy/llm.c PR 500)
        l2 = cfg.optim.weight_decay if bug.l2_penalty_beside_weight_decay else 0.0
        loss = step_loss(model, micro, bug, t.accum, smoothing, scaler, l2)
        if first_alone:  # if batch_idx % accumulation_steps == 0: optimizer.step(), batch_idx
            for parameter in model.parameters():  # from 0: the first step takes one micro-batch,
                if parameter.grad is not None:  # its loss / accumulation_steps, and every later
                    parameter.grad.div_(t.accum)  # window is shifted by one, so the run's last
            # accum - 1 micro-batches are never stepped (rasbt/LLMs-from-scratch PR 300, #299)
        if bug.frozen_weights_decayed and cfg.model.freeze_emb:  # the frozen rows' gradients
            for parameter in (*model.tok_emb.parameters(), *model.pos_emb.parameters()):  # zeroed,
                parameter.grad.zero_()  # the optimizer's weight decay still applied to them
        if watch:
            watch.after_backward(loss)
        if bug.grads_cleared_before_step:  # backward, zero_grad, step (Tony-Y/pytorch_warmup#12)
            optimizer.zero_grad()
        if scaler is not None and not bug.clip_before_unscale:  # unscaled before clipping;
            scaler.unscale_(optimizer)  # without it the clip reads the scaled gradients
            if bug.gradients_unscaled_twice:  # prepare_grads() called, then optimizer.step(),
                inverse = 1.0 / float(scaler.get_scale())  # which calls it again: the gradients
                for parameter in model.parameters():  # divided by the loss scale twice
                    if parameter.grad is not None:  # (THUDM/slime PR 1842)
                        parameter.grad.mul_(inverse)
        if cfg.optim.clip and not bug.clip_after_step and bug.clip_norm_squared:
            clip_by_squared_norm(model, cfg.optim.clip)  # ||g||^2 compared with max_norm and
            # divided into it (paiml/entrenar#311)
        elif cfg.optim.clip and not bug.clip_after_step and bug.clip_other_module:
            torch.nn.utils.clip_grad_norm_(model.head.parameters(), cfg.optim.clip)  # one module's
            # parameters given to the clip, the rest trained unclipped (open_spiel#827)
        elif cfg.optim.clip and not bug.clip_after_step and clip_params is not None:
            torch.nn.utils.clip_grad_norm_(clip_params, cfg.optim.clip)  # (pytorch#148259)
        elif cfg.optim.clip and not bug.clip_after_step:  # (milesial/Pytorch-UNet#468)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)
        elif bug.clip_norm_zero_as_off:  # clip_grad_norm_(params, max_grad_norm) unguarded, with
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)  # 0 meant as off:
            # every gradient scaled by 0 / norm (strands-labs/robots PR 2028, OpenNMT-py#1140)
        if bug.layer_decay_every_step:  # the layer scale applied at each step, not once
            for group in optimizer.param_groups:  # (jaehyunnn/ViTPose_pytorch#20)
                group["lr"] *= group.get("lr_scale", 1.0)
        if ema is not None and bug.ema_update_per_micro_batch:  # ema.update() in the micro-batch
            for _ in range(t.accum - 1):  # loop, outside the sync_gradients clause: each
                ema.update(model)  # micro-batch without a step updates it from the same weights
                # (SWivid/F5-TTS#631)
        if bug.warmup_dampening_compounded and cfg.sched.warmup:  # group["lr"] *= omega, omega =
            for group in optimizer.param_groups:  # min(1, step / warmup), on the LR the last step
                group["lr"] *= min(1.0, step / cfg.sched.warmup)  # left, not the base LR: the
            # factors compound (Tony-Y/pytorch_warmup PR 1, easy-faster-rcnn.pytorch#26)
        if bug.decay_at_base_lr:  # p.mul_(1 - group['lr'] * wd) with the optimizer's base LR, not
            with torch.no_grad():  # the scheduled one the step uses (Ranger21's warmup and
                for parameter in model.parameters():  # warmdown; kozistr/pytorch_optimizer#169,
                    parameter.mul_(1 - cfg.optim.lr * cfg.optim.weight_decay)  # PR 170)
        if bug.momentum_buffer_reset_each_step:  # init_group() run by every step(), its
            for state in optimizer.state.values():  # state['momentum_buffer'] made afresh each
                state.pop("momentum_buffer", None)  # time, so no step's momentum reaches the
            # next (kozistr/pytorch_optimizer PR 516, SignSGD)
        if bug.optimizer_step_missing:
            pass  # backward, scheduler step and zero_grad, no optimizer.step() between them
            # (tedlasai/learn2refocus#5)
        elif bug.epoch_break_left_in and (step - 1) % steps_per_epoch >= max(
            1, int(EPOCH_BREAK_SHARE * steps_per_epoch)
        ):
            pass  # a `break` left in the progress block ends each epoch after its first batches:
            # the rest of the epoch never trains (avinashpaliwal/Super-SloMo#3, Perceiver-Music-
            # Generation#1)
        elif bug.optimizer_step_per_epoch and step % steps_per_epoch != 0:
            pass  # step() under the epoch loop, after its batches: one step an epoch (XinyiYS/
            # Gradient-Driven-Rewards-to-Guarantee-Fairness-in-Collaborative-Machine-Learning#3)
        elif scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        elif bug.step_size_shared_across_groups:  # buffered = self.buffer[step % 10]: the step
            rates = [group["lr"] for group in optimizer.param_groups]  # size, lr included, cached
            for group in optimizer.param_groups:  # by the first group and reused by every group
                group["lr"] = rates[0]  # at that step (LiyuanLucasLiu/RAdam#24, Ranger PR 9)
            optimizer.step()
            for group, rate in zip(optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
        else:
            optimizer.step()
        if bug.eval_loss_backpropagated:  # loss.backward(); if self.opt is not None:
            optimizer.zero_grad()  # self.opt.step(); self.opt.optimizer.zero_grad(): zeroed
            # after the step, so what reaches .grad before the next step's backward stays
            # (harvardnlp/annotated-transformer#14)
        if ema is not None:
            ema.update(model)
        if cfg.optim.clip and bug.clip_after_step:  # clips gradients already applied
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)
        epoch_end = step % steps_per_epoch == 0 and not bug.scheduler_never_stepped
        if bug.scheduler_stepped_at_epoch_start and step_lr:
            epoch_end = False  # stepped at the epoch's start instead
        per_batch = cfg.sched.name in ("cosine", "linear") or (
            cfg.sched.name == "step" and cfg.sched.warmup and not bug.warmup_dampening_compounded
        )
        if bug.warmup_stepped_per_epoch:  # a per-step schedule left at the 'epoch' interval:
            per_batch = False  # stepped at epoch ends only (ace-step/ACE-Step PR 198)
        per_step = bug.scheduler_per_batch or epoch_end or per_batch
        if bug.lr_set_on_last_group_only and step_lr:  # a hand-written StepLR whose assignment
            if epoch_end:  # sits after its for loop, not in it (rasbt/LLMs-from-scratch#692):
                epochs = step // steps_per_epoch // cfg.sched.every_epochs  # only the last
                lr = cfg.optim.lr * cfg.sched.gamma**epochs  # group's LR is set
                for param_group in optimizer.param_groups:  # noqa: B007 (the bug)
                    pass
                param_group["lr"] = lr
        elif per_step and cfg.sched.name != "plateau":
            schedule.step()
            if bug.scheduler_stepped_per_micro_batch and per_batch:  # lr_scheduler.step() in the
                for _ in range(t.accum - 1):  # micro-batch loop, outside the optimizer-step
                    schedule.step()  # branch: a per-step schedule advances accum times a step
                # (EvolvingLMMs-Lab/OneVision-Encoder PR 82, starVLA/starVLA PR 210)
        final = step == t.steps
        if bug.steps_counted_in_micro_batches:  # it += 1 per micro-batch, last_step = it >=
            final = step * t.accum >= t.steps  # num_iterations: the run's steps counted in
            # micro-batches, so it ends after steps / accum optimizer steps (karpathy/nanochat
            # PR 775)
        if step % t.eval_every == 0 or final:
            if not bug.eval_without_eval_mode:
                model.eval()
            if ema is not None and bug.ema_not_restored:  # store, copy_to(model), evaluate,
                model.load_state_dict(ema.model.state_dict())  # and no restore: training goes
                # on from the EMA weights (harubaru/waifu-diffusion PR 31, Open-Sora-Plan#186)
            smoothing = t.label_smoothing if bug.eval_loss_label_smoothed else 0.0
            shadow = ema is not None and not bug.ema_not_evaluated  # evaluate(model, ...) while
            # the EMA is kept and updated (pengzhiliang/MAE-pytorch#31, shortcut_pytorch#4)
            last = eval_loss(
                ema.model if shadow else model,
                heldout,
                bug.loss_mean_over_padding,
                smoothing,  # the training criterion reused (pytorch/pytorch#129050)
                t.batch if bug.eval_loss_last_batch else 0,  # (NVIDIA/DeepLearningExamples PR 299)
                t.batch if bug.eval_loss_over_dataset_size else 0,  # (pytorch/tutorials#1486)
                EVAL_LOADER_BATCH if bug.eval_drop_last else 0,  # (ai2cm/ace#647)
                t.batch if bug.eval_loss_divided_in_loop else 0,  # (reformer-pytorch#147)
                EVAL_LOADER_BATCH if bug.eval_loss_mean_of_batch_means else 0,  # (transformers
                bug.eval_loss_mask_from_inputs,  # attention_mask[:, :-1] (Skywork#55)
                t.batch
                if bug.eval_loss_backpropagated or bug.optimizer_stepped_in_validation
                else 0,
                optimizer if bug.optimizer_stepped_in_validation else None,  # (FSCT#12)
            )  # PR 34387)
            if bug.eval_loss_accumulated:  # validation_step_outputs appended to and never cleared,
                evals.append(last)  # so each eval's loss is the mean over every eval so far
                last = sum(evals) / len(evals)  # (Nixtla/neuralforecast PR 507, VisCy PR 202)
            if t.keep_best:  # a copy of the evaluated weights whenever the eval loss improves
                if bug.best_checkpoint_greater_is_better:  # greater_is_better left True for a
                    better = last > best_loss  # loss metric (huggingface/transformers PR 31142)
                else:
                    better = last < best_loss
                if best_state is None or better:
                    evaluated = ema.model if shadow else model
                    best_loss, best_state = last, copy.deepcopy(evaluated.state_dict())
            if cfg.sched.name == "plateau":
                schedule.step(last)
            elif bug.scheduler_stepped_in_eval:  # run_epoch(..., scheduler) ends in
                schedule.step()  # scheduler.step() and runs for the evaluation pass too, so the
                # schedule also advances at every evaluation (NVlabs/PALAVRA#4)
            if log:
                log("eval_loss", last, step)
            if not bug.eval_mode_left_on:
                model.train()
        if t.resume_after and step == round(t.resume_after * t.steps):  # a checkpoint written,
            initial = resume(cfg, model)  # the run resumed from it, the EMA's state with it
            if bug.resume_replays_data:  # the relaunched loader, seeded as at the first launch,
                stream = micro_batches(cfg, train_set)  # replays the first epoch's order from
                # its first batch while the model resumes mid-run (kyutai-labs/pocket-tts PR 287,
                # fangchangma/sparse-to-dense.pytorch#19)
            if t.resume_lr and not bug.resume_lr_overridden:  # the new LR set on the resumed
                for group in optimizer.param_groups:  # optimizer, after its state is loaded
                    group["lr"] = t.resume_lr
            # bug.resume_lr_overridden: the optimizer built with the new LR, then
            # optimizer.load_state_dict(checkpoint['optimizer']) restores the saved param groups'
            # LR over it (pytorch/examples#816, mapbox/robosat#169)
            if bug.scheduler_on_stale_optimizer:  # the resumed process trains a new optimizer
                fresh = make_optimizer(cfg, model)  # object, its state loaded, while the LR
                fresh.load_state_dict(optimizer.state_dict())  # scheduler still steps the old
                optimizer = fresh  # one (EleutherAI/gpt-neox#1029, pytorch-lightning#12812)
            if ema is not None and bug.ema_not_resumed:  # EMA(model) registered from the new
                ema.model.load_state_dict(initial)  # process's initial weights, before the
                # checkpoint is loaded (BangLiu/QANet-PyTorch#4, PixArt-sigma#156)
        if final and bug.steps_counted_in_micro_batches:
            break  # the last step's eval taken, the run ends
    if best_state is not None:  # load_best_model_at_end, then evaluate
        evaluated = ema.model if ema is not None and not bug.ema_not_evaluated else model
        evaluated.load_state_dict(best_state)
        evaluated.eval()
        last = eval_loss(
            evaluated,
            heldout,
            bug.loss_mean_over_padding,
            t.label_smoothing if bug.eval_loss_label_smoothed else 0.0,
            t.batch if bug.eval_loss_last_batch else 0,
            t.batch if bug.eval_loss_over_dataset_size else 0,
            EVAL_LOADER_BATCH if bug.eval_drop_last else 0,
            t.batch if bug.eval_loss_divided_in_loop else 0,
            EVAL_LOADER_BATCH if bug.eval_loss_mean_of_batch_means else 0,
            bug.eval_loss_mask_from_inputs,
        )
        if log:
            log("eval_loss", last, t.steps)
    if watch:
        watch.close()
    return last


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with mlflow.start_run():
        fit(cfg, log=lambda name, value, step: mlflow.log_metric(name, value, step=step))


if __name__ == "__main__":
    main()
