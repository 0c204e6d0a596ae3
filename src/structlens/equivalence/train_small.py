"""Train small causal LMs on the CPU, for the seed and depth scenarios of interpretive equivalence.

The models are Llama-family transformers with the byte-level tokenizer of
:mod:`structlens.models.tiny` (257 tokens), trained for next-byte prediction on the bundled
Jane Austen corpus (``structlens.data.corpus.load_texts(None)``). Everything that decides the
weights is in :class:`SmallLMConfig`; under one config and seed the run is deterministic on
one device and thread count. The checkpoint is an ordinary Hugging Face directory (safetensors
plus tokenizer), so ``structlens.models.load_model(path)`` loads it like any other model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["SmallLMConfig", "corpus_batches", "train_small_lm", "train_small_lms"]


@dataclasses.dataclass(frozen=True)
class SmallLMConfig:
    """Architecture and schedule of a small byte-level LM.

    Attributes
    ----------
    n_layers, d_model, n_heads, d_mlp : int
        Depth, width, heads (``d_head = d_model / n_heads``) and MLP width.
    encoder_layers : int
        0: a decoder-only Llama.  Otherwise a T5 encoder–decoder with this many encoder
        layers and ``n_layers`` decoder layers, trained on the same bytes with the same
        next-byte objective on the decoder while the encoder reads the preceding context (a
        prefix of 0 to :attr:`max_context` bytes, drawn per step; an empty one is the decoder
        start token).  Its config says ``structlens_empty_source``, so ``load_model`` runs it
        as a language model over the decoder, position for position like the decoder-only
        models, with an empty source unless one is given (the equivalence comparison gives
        it the text before each probe sentence).
    seq_len, batch_size, steps : int
        Training windows of ``seq_len`` bytes, ``batch_size`` windows per step, at most
        ``steps`` steps.
    lr : float
        Peak AdamW learning rate (linear warm-up over 5 % of ``steps``, cosine decay).
    eval_every, converge_tol, patience : int, float, int
        The stopping rule: every ``eval_every`` steps the loss on the held-out last tenth of
        the corpus (never trained on) is measured; training stops once ``patience``
        evaluations in a row improved on the best loss so far by less than ``converge_tol``
        (relative), or after ``steps``.  ``eval_every=0`` trains all ``steps`` unmeasured.
    seed : int
        Seeds the initialisation and the order of the windows.
    """

    n_layers: int = 4
    encoder_layers: int = 0
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int = 512
    seq_len: int = 64
    batch_size: int = 8
    steps: int = 400
    lr: float = 3e-3
    weight_decay: float = 0.01
    eval_every: int = 0
    converge_tol: float = 0.005
    patience: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}.")
        if min(self.n_layers, self.steps, self.batch_size) < 1 or self.seq_len < 2:
            raise ValueError("n_layers, steps and batch_size must be >= 1 and seq_len >= 2.")
        if self.eval_every < 0 or self.patience < 1 or self.converge_tol < 0:
            raise ValueError("eval_every and converge_tol must be >= 0 and patience >= 1.")
        if self.encoder_layers < 0:
            raise ValueError(f"encoder_layers must be >= 0, got {self.encoder_layers}.")

    @property
    def max_context(self) -> int:
        """The most bytes of preceding context an encoder–decoder's encoder is trained on
        (``seq_len / 2``; 0 for a decoder-only model)."""
        return self.seq_len // 2 if self.encoder_layers else 0

    def key(self) -> dict[str, Any]:
        """The settings that decide the weights, without ``encoder_layers`` when it is 0 (so
        decoder-only runs recorded before the field existed stay valid)."""
        d = dataclasses.asdict(self)
        if not d["encoder_layers"]:
            del d["encoder_layers"]
        return d


def _corpus_bytes(tokenizer: object) -> torch.Tensor:
    from structlens.data.corpus import load_texts

    ids: list[int] = []
    eos = int(tokenizer.eos_token_id)  # type: ignore[attr-defined]
    for doc in load_texts(None):
        ids.extend(tokenizer(doc.text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def corpus_batches(
    tokens: torch.Tensor, seq_len: int, batch_size: int, steps: int, seed: int
) -> list[torch.Tensor]:
    """``steps`` batches ``[batch_size, seq_len]`` of windows at seeded random offsets."""
    if tokens.numel() <= seq_len:
        raise ValueError(f"corpus of {tokens.numel()} tokens is shorter than seq_len={seq_len}.")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, tokens.numel() - seq_len, (steps, batch_size), generator=gen)
    offsets = torch.arange(seq_len)
    return [tokens[s[:, None] + offsets] for s in starts]


HELD_OUT = 0.1  # share of the corpus bytes (its end) kept for the stopping rule


def _held_out_loss(model: Any, held: torch.Tensor, seq_len: int, max_windows: int = 64) -> float:
    """Mean next-byte loss over non-overlapping ``seq_len`` windows of the held-out bytes (an
    encoder–decoder with an empty source: the same predictions as a decoder-only model)."""
    n = min(max_windows, held.numel() // seq_len)
    windows = held[: n * seq_len].view(n, seq_len)
    with torch.no_grad():
        return float(_lm_loss(model, windows, context=0))


def _lm_loss(model: Any, windows: torch.Tensor, context: int) -> torch.Tensor:
    """Next-byte loss of ``windows``; an encoder–decoder reads the first ``context`` bytes of
    each window into the encoder (none: the start token) and predicts the rest."""
    if not model.config.is_encoder_decoder:
        return model(input_ids=windows, labels=windows, use_cache=False).loss
    start = int(model.config.decoder_start_token_id)
    source = windows[:, :context] if context else torch.full((len(windows), 1), start)
    target = windows[:, context:]
    return model(
        input_ids=source.contiguous(),
        decoder_input_ids=target[:, :-1].contiguous(),
        labels=target[:, 1:].contiguous(),
        use_cache=False,
    ).loss


def _build(config: SmallLMConfig) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

    from structlens.models.tiny import VOCAB

    special: dict[str, Any] = dict(
        pad_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, tie_word_embeddings=False
    )
    hf_cfg: Any
    if config.encoder_layers:
        hf_cfg = T5Config(
            vocab_size=VOCAB,
            d_model=config.d_model,
            d_kv=config.d_model // config.n_heads,
            d_ff=config.d_mlp,
            num_layers=config.encoder_layers,
            num_decoder_layers=config.n_layers,
            num_heads=config.n_heads,
            dropout_rate=0.0,
            **special | {"decoder_start_token_id": VOCAB - 1},
        )
        hf_cfg.structlens_empty_source = True
        hf_cfg.architectures = ["T5ForConditionalGeneration"]
        cls: Any = T5ForConditionalGeneration
    else:
        hf_cfg = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=config.d_model,
            num_hidden_layers=config.n_layers,
            num_attention_heads=config.n_heads,
            num_key_value_heads=config.n_heads,
            intermediate_size=config.d_mlp,
            max_position_embeddings=max(256, config.seq_len),
            bos_token_id=VOCAB - 1,
            **special,
        )
        cls = LlamaForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        return cls(hf_cfg)


def train_small_lm(config: SmallLMConfig, out_dir: str | Path, log_every: int = 100) -> Path:
    """Train one small byte-level LM and save it to ``out_dir`` (HF format).

    Trains on the first nine tenths of the corpus bytes; the last tenth is held out for the
    stopping rule of :class:`SmallLMConfig`.  Skips training when ``out_dir/train.json``
    records the same config (a finished run).  Returns ``out_dir``. ``train.json`` holds the
    config, the training loss curve (nats per byte, every ``log_every`` steps), the held-out
    curve ``[[step, loss], ...]``, ``steps_run``, ``converged`` (the rule stopped it before the
    step budget; ``None`` when ``eval_every=0``) and the wall time.
    """
    from structlens.models.tiny import byte_tokenizer

    out = Path(out_dir)
    record = out / "train.json"
    cfg = config.key()
    if record.exists() and json.loads(record.read_text()).get("config") == cfg:
        return out
    tok = byte_tokenizer()
    model = _build(config)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    warm = max(1, config.steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return config.lr * (step + 1) / warm
        frac = (step - warm) / max(1, config.steps - warm)
        return config.lr * 0.5 * (1 + math.cos(math.pi * frac))

    data = _corpus_bytes(tok)
    n_held = max(config.seq_len + 1, int(HELD_OUT * data.numel()))
    train, held = data[:-n_held], data[-n_held:]
    # an encoder–decoder's windows carry up to max_context bytes of context before them
    ctx = config.max_context
    width = config.seq_len + ctx
    batches = corpus_batches(train, width, config.batch_size, config.steps, config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    contexts = torch.randint(0, ctx + 1, (config.steps,), generator=gen)
    losses: list[tuple[int, float]] = []
    held_curve: list[tuple[int, float]] = []
    best, stale = math.inf, 0
    converged: bool | None = False if config.eval_every else None
    t0 = time.perf_counter()
    running = 0.0
    for step, batch in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        c = int(contexts[step])
        loss = _lm_loss(model, batch[:, ctx - c :], context=c)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running += float(loss.detach())
        if (step + 1) % log_every == 0 or step + 1 == config.steps:
            n = (step % log_every) + 1
            losses.append((step + 1, running / n))
            running = 0.0
        if config.eval_every and (step + 1) % config.eval_every == 0:
            model.eval()
            loss_h = _held_out_loss(model, held, config.seq_len)
            model.train()
            held_curve.append((step + 1, loss_h))
            stale = stale + 1 if loss_h > best * (1 - config.converge_tol) else 0
            best = min(best, loss_h)
            if stale >= config.patience:
                # at the last step the cosine rate has reached 0: a stall there is the
                # schedule's end, not a plateau
                converged = step + 1 < config.steps
                if not losses or losses[-1][0] != step + 1:
                    losses.append((step + 1, running / ((step % log_every) + 1)))
                break
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    record.write_text(
        json.dumps(
            {
                "config": cfg,
                "loss": losses,
                "held_out_loss": held_curve,
                "steps_run": losses[-1][0],
                "converged": converged,
                "seconds": time.perf_counter() - t0,
            },
            indent=1,
        )
    )
    return out


@dataclasses.dataclass
class _TrainSmall:
    """One small LM of a scenario set; picklable so an executor can train them in parallel."""

    log_every: int

    def __call__(self, job: tuple[SmallLMConfig, str]) -> Path:
        return train_small_lm(job[0], job[1], self.log_every)


def train_small_lms(
    configs: Sequence[SmallLMConfig],
    out_dirs: Sequence[str | Path],
    *,
    log_every: int = 100,
    executor: Any = None,
) -> list[Path]:
    """Train several small LMs (e.g. the seed and depth scenarios) as independent items.

    Each run is :func:`train_small_lm` (seeded, so the same on every executor); ``executor``
    (e.g. ``"ray"``) trains them in parallel.  ``out_dirs`` must be on storage the workers
    share with the caller.  Returns the output directories in the order of ``configs``.
    """
    from structlens.execution import get_executor

    if len(configs) != len(out_dirs):
        raise ValueError(f"{len(configs)} configs but {len(out_dirs)} output directories.")
    jobs = [(c, str(d)) for c, d in zip(configs, out_dirs, strict=True)]
    return list(get_executor(executor).map(_TrainSmall(log_every), jobs, desc="small LMs"))
