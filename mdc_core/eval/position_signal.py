"""Visual signal by caption position: how much the true image lowers each token's loss (beyond the paper).

The paper argues that an autoregressive captioner's visual learning signal fades along the sequence (late
tokens are predictable from the caption prefix alone) while masked diffusion keeps needing the image at every
position. This measures it. For caption token position i (0 = the first token after ``<sot>``)::

    signal_i = E[ CE_i(mismatched image) - CE_i(true image) ]        (nats; > 0: the image helps)

where the mismatched image is another image of the same batch (the batch rolled by one), the caption and the
masks are unchanged, and CE is the loss the objective trains on:

* ``teacher_forcing`` (ARC runs): CE of token i given ``<sot>`` and tokens < i (causal decoder).
* ``masked`` (MDC, MDC without 1/t, BERT, parallel runs): each caption token masked with probability r, CE at the
  masked positions given the unmasked ones (bidirectional decoder); one curve per ratio r, averaged over
  `draws` mask draws (one draw at r = 1, where every draw is the same). :func:`position_signal_runs` takes the
  ratios from each run's training range (:func:`training_ratios`; MDC: 0.5, 0.75, 1) unless given.

``<eot>`` is not a caption position (ARC also predicts it; left out so both modes score the same tokens). The
expectation is over the captions that have a token at position i (and, for masked mode, where it was masked);
``count`` says how many terms each mean has.

Per caption, the result also has its *fade* (``caption_fades``, one number per caption in data order): for each
setting, the caption's signal at each of its scored positions (averaged over mask draws), then the mean over the
later half of those positions minus the mean over the earlier half (the middle one of an odd count goes to the
later half), averaged over the settings that scored at least two of its positions (0.0 when none did). These are
the test items behind a paired bootstrap of "MDC's fade minus ARC's" (:mod:`mdc_core.eval.claims`).

The fade compares different words (a caption's later half holds other words than its earlier half), so word
type and position are confounded; :mod:`mdc_core.eval.visual_reliance` is the direct test (normalised per model,
captions whose later words are or are not predictable).

The *repeat fade* (``repeat_fades``; exploratory) holds the word fixed: for every word that a caption names twice
or more (optionally only the `content_words`, e.g. colours and shapes), the signal at its later mentions minus
that at its first mention, averaged over the caption's repeated words and the settings (None for a caption
without a scored repeat). The paper's mechanism predicts it: a causal decoder can copy a repeated
word from the prefix and stops needing the image there, so ARC's repeat fade is negative; a masked decoder sees
either mention from the other side as often, so MDC's stays near 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mdc_core.checkpoint import load_model
from mdc_core.config import DataConfig, RunConfig
from mdc_core.data import build_loader
from mdc_core.eval.figures import save_png
from mdc_core.objectives import apply_mask, maskable_positions, objective_spec, trim_padding
from mdc_core.tokenizer import MASK_ID, CaptionTokenizer

MODES = ("teacher_forcing", "masked")
DEFAULT_RATIOS = (0.5, 0.75, 1.0)  # MDC's training range t ~ U[0.5, 1]
SIGNAL_DEFINITION = "loss with a mismatched image (batch rolled by one) minus loss with the true image, in nats"


def training_ratios(cfg: RunConfig) -> tuple[float, ...]:
    """Masking ratios inside the range a masked run was trained on: its fixed ratio (BERT; 1 for parallel), else
    three evenly spaced ratios of [t_low, t_high] (ratio 0, which masks nothing, left out)."""
    return objective_spec(cfg.objective.name).scoring_ratios(cfg.objective)


@dataclass
class SignalCurve:
    """Mean per-position losses of one setting; lists indexed by caption position (NaN where count = 0)."""

    label: str  # "teacher forcing" or "r=0.50"
    ratio: float | None  # masking ratio r (None for teacher forcing)
    loss_true: list[float]
    loss_mismatched: list[float]
    signal: list[float]  # loss_mismatched - loss_true
    count: list[int]  # scored tokens behind each mean

    @property
    def mean_signal(self) -> float:
        """Token-weighted mean signal over all positions."""
        total = sum(self.count)
        return sum(s * c for s, c in zip(self.signal, self.count, strict=True) if c) / total if total else math.nan


@dataclass
class PositionSignal:
    """Result for one model: its mode and one curve per setting."""

    mode: str
    curves: list[SignalCurve] = field(default_factory=list)
    n_captions: int = 0
    caption_fades: list[float] = field(default_factory=list)  # per caption, data order (module docstring)
    repeat_fades: list[float | None] = field(default_factory=list)  # per caption, data order; None: no repeat

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for d, c in zip(out["curves"], self.curves, strict=True):
            d["mean_signal"] = c.mean_signal
            for key in ("loss_true", "loss_mismatched", "signal"):  # NaN is not JSON: empty positions -> None
                d[key] = [None if math.isnan(v) else v for v in d[key]]
        out["signal_definition"] = SIGNAL_DEFINITION
        return out


def scoring_settings(model: torch.nn.Module, mode: str | None, ratios: Sequence[float],
                     draws: int) -> tuple[str, list[tuple[float | None, int]]]:
    """The scoring mode (default from the model: a causal decoder is scored by teacher forcing) and its settings:
    ``[(None, 1)]`` for teacher forcing, else ``(ratio, mask draws)`` per ratio (one draw at ratio 1, where the
    mask is certain). Raises ValueError naming a bad mode, ratio or draw count."""
    mode = mode or ("teacher_forcing" if getattr(model, "causal", False) else "masked")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "masked" and (not ratios or any(not 0.0 < r <= 1.0 for r in ratios)):
        raise ValueError(f"masking ratios must lie in (0, 1], got {list(ratios)}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    if mode == "teacher_forcing":
        return mode, [(None, 1)]
    return mode, [(float(r), 1 if r == 1.0 else draws) for r in ratios]


def token_losses(model: torch.nn.Module, image_tokens: Tensor, tokens: Tensor, mask: Tensor | None) -> Tensor:
    """Per-token cross-entropy at the scored positions, (n,) in row-major order of :func:`scored_positions`.

    tokens (B, L), image_tokens (B, M, D). `mask` (B, L) None: teacher forcing (the token at column j predicted
    from columns < j). Otherwise the masked positions of `tokens` are replaced by ``[MASK]`` and predicted.
    """
    if mask is None:
        scored = maskable_positions(tokens)[:, 1:]  # (B, L-1) targets in columns 1.., caption tokens only
        logits = model.decode(tokens[:, :-1], image_tokens, select=scored, causal=True)  # (n, V_out)
        targets = tokens[:, 1:][scored]
    else:
        noisy = tokens.masked_fill(mask, MASK_ID)
        logits = model.decode(noisy, image_tokens, select=mask, causal=False)  # (n, V_out)
        targets = tokens[mask]
    rows = model.output_index[targets]
    if bool((rows < 0).any()):
        raise ValueError(f"caption token ids {targets[rows < 0].unique()[:5].tolist()} have no row in the model's "
                         "output vocabulary (its corpus vocabulary comes from other captions)")
    return F.cross_entropy(logits.float(), rows, reduction="none")


def scored_positions(tokens: Tensor, mask: Tensor | None) -> Tensor:
    """Caption position (column - 1) of each scored token, (n,), in the order :func:`token_losses` returns."""
    scored = maskable_positions(tokens) if mask is None else mask  # (B, L)
    return scored.nonzero()[:, 1] - 1


def caption_fades(caption: Tensor, pos: Tensor, signal: Tensor, n_captions: int) -> list[float | None]:
    """Per caption (0..n_captions-1): its later-half minus earlier-half mean signal over its own scored positions
    (tokens scored at one position several times, e.g. over mask draws, are averaged first); None with fewer
    than two scored positions. `caption`, `pos`, `signal`: (n,) per scored token."""
    out: list[float | None] = [None] * n_captions
    if len(caption) == 0:
        return out
    width = int(pos.max()) + 1
    key = caption.long() * width + pos.long()
    sums = torch.zeros(n_captions * width, dtype=torch.float64).index_add_(0, key, signal.double())
    counts = torch.zeros(n_captions * width, dtype=torch.float64).index_add_(0, key, torch.ones_like(signal,
                                                                                                    dtype=torch.float64))
    sums, counts = sums.view(n_captions, width), counts.view(n_captions, width)
    for b in range(n_captions):
        scored = counts[b].nonzero().flatten()
        if len(scored) < 2:
            continue
        means = sums[b, scored] / counts[b, scored]
        half = len(scored) // 2
        out[b] = float(means[half:].mean() - means[:half].mean())
    return out


def repeat_fades(caption: Tensor, pos: Tensor, token: Tensor, signal: Tensor, n_captions: int,
                 words: Tensor | None = None) -> list[float | None]:
    """Per caption (0..n_captions-1): over the token ids it has at two or more scored positions (only ids in
    `words`, when given), the mean signal at the later positions minus that at the earliest one, averaged over
    those ids; None without such an id. Tokens scored at one position several times (mask draws) are averaged
    first. `caption`, `pos`, `token`, `signal`: (n,) per scored token."""
    out: list[float | None] = [None] * n_captions
    per: dict[tuple[int, int, int], list[float]] = {}  # (caption, token id, position) -> signals
    keep = None if words is None else set(words.tolist())
    for b, p, t, v in zip(caption.tolist(), pos.tolist(), token.tolist(), signal.tolist(), strict=True):
        if keep is None or t in keep:
            per.setdefault((b, t, p), []).append(v)
    mentions: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (caption, token id) -> [(position, signal)]
    for (b, t, p), values in per.items():
        mentions.setdefault((b, t), []).append((p, sum(values) / len(values)))
    diffs: dict[int, list[float]] = {}
    for (b, _), found in mentions.items():
        if len(found) < 2:
            continue
        found.sort()
        later = [v for _, v in found[1:]]
        diffs.setdefault(b, []).append(sum(later) / len(later) - found[0][1])
    for b, d in diffs.items():
        out[b] = sum(d) / len(d)
    return out


class _Accumulator:
    """Running sums of the true / mismatched losses per caption position."""

    def __init__(self) -> None:
        self.true, self.mis, self.count = (torch.zeros(0, dtype=torch.float64) for _ in range(3))
        self.tokens: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # (caption, position, signal, token id)

    def add(self, pos: Tensor, ce_true: Tensor, ce_mis: Tensor, caption: Tensor | None = None,
            token: Tensor | None = None) -> None:
        pos = pos.cpu()
        if caption is not None:
            ids = token.cpu() if token is not None else torch.full_like(pos, -1)
            self.tokens.append((caption.cpu(), pos, (ce_mis - ce_true).double().cpu(), ids))
        size = int(pos.max()) + 1 if len(pos) else 0
        if size > len(self.true):
            grow = size - len(self.true)
            self.true, self.mis, self.count = (torch.cat([t, torch.zeros(grow, dtype=torch.float64)])
                                               for t in (self.true, self.mis, self.count))
        self.true.index_add_(0, pos, ce_true.double().cpu())
        self.mis.index_add_(0, pos, ce_mis.double().cpu())
        self.count.index_add_(0, pos, torch.ones(len(pos), dtype=torch.float64))

    def curve(self, label: str, ratio: float | None) -> SignalCurve:
        n = self.count.clamp(min=1)
        empty = self.count == 0
        true = (self.true / n).masked_fill(empty, math.nan)
        mis = (self.mis / n).masked_fill(empty, math.nan)
        return SignalCurve(label, ratio, true.tolist(), mis.tolist(), (mis - true).tolist(),
                           [int(c) for c in self.count])

    def caption_fades(self, n_captions: int) -> list[float | None]:
        if not self.tokens:
            return [None] * n_captions
        caption, pos, signal, _ = (torch.cat(parts) for parts in zip(*self.tokens, strict=True))
        return caption_fades(caption, pos, signal, n_captions)

    def repeat_fades(self, n_captions: int, words: Tensor | None) -> list[float | None]:
        if not self.tokens:
            return [None] * n_captions
        caption, pos, signal, token = (torch.cat(parts) for parts in zip(*self.tokens, strict=True))
        return repeat_fades(caption, pos, token, signal, n_captions, words)


@torch.no_grad()
def position_signal(model: torch.nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, mode: str | None = None,
                    ratios: Sequence[float] = DEFAULT_RATIOS, draws: int = 4, seed: int = 0,
                    content_words: Tensor | None = None) -> PositionSignal:
    """Visual signal per caption position of a captioner (see the module docstring).

    Args:
        model: a :class:`~mdc_core.model.Captioner` (in eval mode; its device is used).
        batches: (images (B, 3, S, S), tokens (B, L)) pairs; B >= 2 (a batch of one has no other image).
        mode: ``teacher_forcing`` or ``masked``; default from the model (causal decoder -> teacher forcing).
        ratios: masking ratios r of the masked mode. draws: mask draws per batch and ratio (seeded by `seed`).
        content_words: token ids the repeat fade is restricted to (None: every caption token).
    """
    mode, settings = scoring_settings(model, mode, ratios, draws)
    device = next(model.parameters()).device
    accs = [_Accumulator() for _ in settings]
    gen = torch.Generator().manual_seed(seed)  # masks are drawn on the CPU: the same on every device
    n_captions = 0
    for images, tokens in batches:
        if len(images) != len(tokens):
            raise ValueError(f"batch has {len(images)} images but {len(tokens)} captions")
        if len(images) < 2:
            raise ValueError("position signal needs batches of >= 2 images (the mismatched image comes from the batch)")
        tokens = trim_padding(tokens.cpu())
        image_tokens = model.encode_image(images.to(device))  # (B, M, D)
        rolled = image_tokens.roll(1, dims=0)  # caption b meets image b-1
        for (ratio, n_draws), acc in zip(settings, accs, strict=True):
            for _ in range(n_draws):
                mask = None if ratio is None else apply_mask(tokens, torch.full((len(tokens),), ratio),
                                                             generator=gen)[1]
                dev_tokens = tokens.to(device)
                dev_mask = None if mask is None else mask.to(device)
                ce_true = token_losses(model, image_tokens, dev_tokens, dev_mask)
                ce_mis = token_losses(model, rolled, dev_tokens, dev_mask)
                scored = maskable_positions(tokens) if mask is None else mask
                acc.add(scored_positions(tokens, mask), ce_true, ce_mis, scored.nonzero()[:, 0] + n_captions,
                        tokens[scored])
        n_captions += len(tokens)
    if n_captions == 0:
        raise ValueError("no caption to score: the data gave no batch")
    curves = [acc.curve("teacher forcing" if r is None else f"r={r:.2f}", r) for (r, _), acc in zip(settings, accs,
                                                                                                   strict=True)]
    per_setting = [acc.caption_fades(n_captions) for acc in accs]
    fades = []
    for b in range(n_captions):
        known = [f[b] for f in per_setting if f[b] is not None]
        fades.append(sum(known) / len(known) if known else 0.0)
    per_setting = [acc.repeat_fades(n_captions, content_words) for acc in accs]
    repeats: list[float | None] = []
    for b in range(n_captions):
        known = [f[b] for f in per_setting if f[b] is not None]
        repeats.append(sum(known) / len(known) if known else None)
    return PositionSignal(mode, curves, n_captions, fades, repeats)


# ----------------------------------------------------------------------------------------------------------
# runs on a data set, JSON and plot


def _batches(data: str | Path, split: str, image_size: int, context_length: int, batch_size: int,
             limit: int, images: str | Path | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    tokenizer = CaptionTokenizer(context_length)
    cfg = DataConfig(path=str(data), images=str(images or ""), shuffle_buffer=0)
    loader = build_loader(cfg, split=split, image_size=image_size,
                          batch_size=batch_size, shuffle=False, drop_last=False)
    seen = 0
    for batch in loader:
        n = min(len(batch["caption"]), limit - seen)
        if n < 2:  # a last batch of one image has no mismatched partner
            return
        yield batch["image"][:n], tokenizer.tokenize_batch(batch["caption"][:n])[0]
        seen += n
        if seen >= limit:
            return


def position_signal_runs(runs: Sequence[str | Path], data: str | Path, *, split: str = "test", limit: int = 256,
                         batch_size: int = 32, ratios: Sequence[float] | None = None, draws: int = 4,
                         seed: int = 0, device: str = "cpu", ema: bool = False,
                         images: str | Path | None = None, content_words: Sequence[str] | None = None
                         ) -> dict[str, Any]:
    """:func:`position_signal` of each run on the first `limit` captions of `split` of `data` (`images`: the image
    folder of a caption json or table, default found); a JSON-ready dict
    ``{"data", "split", "signal_definition", "content_words", "runs": [{"run", "objective",
    **PositionSignal.to_dict()}]}``. `content_words`: the words the repeat fade follows, e.g. the embedded data's
    colours and shapes; only those that are one token of the caption tokenizer (``content_words`` of the result
    lists them; "cyan" is two); None: every caption token."""
    if not runs:
        raise ValueError("give at least one run")
    if limit < 2 or batch_size < 2:
        raise ValueError(f"limit and batch_size must be >= 2 (got {limit}, {batch_size})")
    word_ids, followed = None, None
    if content_words is not None:
        encoded = {w: CaptionTokenizer().encode_text(w) for w in content_words}
        followed = [w for w, ids in encoded.items() if len(ids) == 1]
        if not followed:
            raise ValueError(f"none of the content words {list(content_words)} is one token of the caption "
                             "tokenizer: the repeat fade follows single-token words")
        word_ids = torch.tensor(sorted({encoded[w][0] for w in followed}))
    out = []
    for run in runs:
        model, cfg = load_model(run, device=device, ema=ema)
        if objective_spec(cfg.objective.name).family == "contrastive":
            raise ValueError(f"{run} is a {cfg.objective.name} run: position signal needs a captioner (a CLIP run "
                             "has no per-token loss)")
        batches = _batches(data, split, cfg.model.image_size, cfg.model.context_length, batch_size, limit, images)
        result = position_signal(model, batches, ratios=ratios or training_ratios(cfg), draws=draws, seed=seed,
                                 content_words=word_ids)
        out.append({"run": str(run), "objective": cfg.objective.name, **result.to_dict()})
    return {"data": str(data), "split": split, "limit": limit, "seed": seed, "draws": draws,
            "signal_definition": SIGNAL_DEFINITION,
            "content_words": followed, "runs": out}


def plot_position_signal(result: dict[str, Any], path: str | Path) -> Path:
    """Line plot of every run's curves (signal vs caption position) from :func:`position_signal_runs`; a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in result["runs"]:
        name = Path(run["run"]).name
        for curve in run["curves"]:
            xs = [i for i, v in enumerate(curve["signal"]) if v is not None]
            ys = [curve["signal"][i] for i in xs]
            style = "-" if run["mode"] == "teacher_forcing" else "--"
            ax.plot(xs, ys, style, marker="o", ms=3, label=f"{name} ({run['objective']}, {curve['label']})")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("caption token position")
    ax.set_ylabel("loss(mismatched image) - loss(true image) [nats]")
    ax.set_title("visual signal by position")
    ax.legend(fontsize=7)
    return save_png(fig, path)
