"""Caption tokenizer: open_clip's CLIP BPE with a ``[MASK]`` id appended (docs/design.md "Decisions").

Ids: 0..49407 are CLIP's BPE vocabulary (``<sot>`` = 49406, ``<eot>`` = 49407). Padding uses id 0, which is also
the real token "!", so decoding always cuts at ``<eot>``. ``[MASK]`` = 49408 lives only in the decoder's input
embedding table; the output head never predicts it. A head restricted to the token ids of the training corpus
(``model.output_vocab = "corpus"``) uses the id table of :func:`build_output_vocab` and the helpers at the end.

The BPE comes from open_clip without importing the ``open_clip`` package, whose ``__init__`` imports its model zoo
(``transformers``, scikit-learn: seconds of start-up): its ``tokenizer.py`` and ``constants.py`` import nothing from
their package, so :func:`open_clip_module` executes them from the installed folder as stand-alone modules.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

VOCAB_SIZE = 49408  # CLIP BPE vocabulary, specials included
SOT_ID = 49406
EOT_ID = 49407
PAD_ID = 0  # also the real token "!"; never confuse the two: cut at <eot> first
MASK_ID = VOCAB_SIZE  # appended after the BPE vocabulary
EMBED_SIZE = VOCAB_SIZE + 1  # rows of the decoder's input embedding
# bounds checked before BPE, whose cost grows with the square of a word's length (16k letters: 21 s)
MAX_CAPTION_CHARS = 4096  # a caption (COCO's longest: under 300)
MAX_WORD_CHARS = 100  # a word: a run of characters without whitespace


class CaptionTooLong(ValueError):
    """A caption or one of its words is longer than the tokenizer reads (:data:`MAX_CAPTION_CHARS`,
    :data:`MAX_WORD_CHARS`); the message echoes at most 40 characters of it."""


def shown(text: str, limit: int = 60) -> str:
    """`text` quoted for an error message, cut to `limit` characters (a pasted paragraph stays one short line)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def length_problem(text: str) -> str:
    """What makes `text` too long to tokenize, in a few words with a bounded echo ('' when nothing does)."""
    if len(text) > MAX_CAPTION_CHARS:
        return f"{shown(text, 40)} is longer than the {MAX_CAPTION_CHARS} characters a caption may have"
    if len(text) > MAX_WORD_CHARS:
        longest = max(text.split(), key=len, default="")
        if len(longest) > MAX_WORD_CHARS:
            return f"its word {shown(longest, 40)} is longer than the {MAX_WORD_CHARS} characters a word may have"
    return ""


def caption_problem(text: str) -> str:
    """Why `text` cannot be a training caption ('empty_caption', 'caption_too_long'; '' when it can): what the data
    loaders skip and count rather than stop the run on."""
    if length_problem(text):
        return "caption_too_long"
    return "" if text.strip() and _bpe().encode(text) else "empty_caption"


@cache
def open_clip_module(name: str) -> ModuleType:
    """open_clip's module `name` (``tokenizer`` or ``constants``), without running the package's ``__init__``."""
    if f"open_clip.{name}" in sys.modules:
        return sys.modules[f"open_clip.{name}"]
    package = importlib.util.find_spec("open_clip")  # locates the package; does not execute it
    if package is None or not package.submodule_search_locations:
        raise ImportError("open_clip_torch is not installed (pip install open_clip_torch); the caption tokenizer "
                          "and the image normalisation come from it")
    path = Path(next(iter(package.submodule_search_locations))) / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mdc_core._open_clip_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} from the installed open_clip_torch")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _bpe():  # open_clip.tokenizer.SimpleTokenizer, from the BPE merges shipped in the open_clip wheel (no network)
    return open_clip_module("tokenizer").SimpleTokenizer()


class CaptionTokenizer:
    """Turns captions into fixed-length id tensors ``<sot> ids <eot> pad...`` and back."""

    def __init__(self, context_length: int = 77) -> None:
        if context_length < 3:
            raise ValueError(f"context_length must be >= 3, got {context_length}")
        self.context_length = context_length
        self.bpe = _bpe()

    def encode_text(self, text: str) -> list[int]:
        """BPE ids of `text` without specials (lower-cased and cleaned as CLIP does); :class:`CaptionTooLong` for
        a text or a word longer than the bounds (checked before BPE)."""
        problem = length_problem(text)
        if problem:
            raise CaptionTooLong(f"caption too long to tokenize: {problem}")
        return self.bpe.encode(text)

    def __call__(self, texts: str | Sequence[str], *, truncate: bool = True,
                 context_length: int | None = None) -> torch.Tensor:
        """Tokenize captions into a (B, L) LongTensor with L = context_length.

        Over-long captions are cut to ``L - 2`` BPE tokens plus ``<eot>`` when `truncate` (what training
        does, as the paper's "padded or truncated to 77 tokens"); otherwise they raise ``ValueError``.
        Empty captions (no BPE token after cleaning) always raise ``ValueError``."""
        if isinstance(texts, str):
            texts = [texts]
        length = context_length or self.context_length
        out = torch.full((len(texts), length), PAD_ID, dtype=torch.long)
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"caption {row} is {type(text).__name__}, expected str")
            problem = length_problem(text)
            if problem:
                raise CaptionTooLong(f"caption {row} is too long to tokenize: {problem}")
            ids = self.encode_text(text)
            if not ids:
                raise ValueError(f"caption {row} is empty after tokenization: {text[:60]!r}")
            if len(ids) > length - 2:
                if not truncate:
                    raise ValueError(f"caption {row} has {len(ids)} tokens but the model's context holds "
                                     f"{length - 2} (context_length {length} minus <sot>/<eot>): {text[:80]!r}")
                ids = ids[: length - 2]
            seq = [SOT_ID, *ids, EOT_ID]
            out[row, : len(seq)] = torch.tensor(seq)
        return out

    def tokenize_batch(self, texts: Sequence[str]) -> tuple[torch.Tensor, int]:
        """Training-time tokenization: (B, L) ids with over-long captions truncated, and how many were cut."""
        lengths = [len(self.encode_text(t)) for t in texts]  # BPE results are cached, so this is cheap
        return self(texts, truncate=True), sum(n > self.context_length - 2 for n in lengths)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Caption text of one id sequence: drops ``<sot>``, cuts at ``<eot>``, shows ``[MASK]`` literally."""
        return "".join(self.token_strings(ids, keep_space=True)).strip()

    def batch_decode(self, ids: torch.Tensor) -> list[str]:
        """Decode each row of a (B, L) tensor."""
        return [self.decode(row) for row in ids]

    def token_strings(self, ids: Sequence[int] | torch.Tensor, *, keep_space: bool = False) -> list[str]:
        """One display string per token (``<sot>`` dropped, cut at ``<eot>``); ``[MASK]`` for masks.

        With `keep_space` a word-final token carries its trailing space, so ``"".join`` gives the text."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        end = ids.index(EOT_ID) if EOT_ID in ids else len(ids)
        return [self.token_string(i, keep_space=keep_space) for i in ids[:end] if i != SOT_ID]

    def words_with(self, ids: Sequence[int] | torch.Tensor, wanted: set[int]) -> list[str]:
        """The distinct words of `ids` (one caption's, specials skipped) that hold any id of `wanted`, each decoded
        whole: a character split over several byte-level tokens (an emoji) reads as itself, not as '\ufffd' pieces."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        words: list[str] = []
        piece, hit = bytearray(), False
        end = ids.index(EOT_ID) if EOT_ID in ids else len(ids)  # what follows <eot> is padding
        for i in [*ids[:end], None]:
            special = i is None or i in (SOT_ID, MASK_ID) or not 0 <= i < VOCAB_SIZE
            if not special:
                text = self.bpe.decoder[i]
                piece += bytearray(self.bpe.byte_decoder[c] for c in text.removesuffix("</w>"))
                hit = hit or i in wanted
            if special or text.endswith("</w>"):
                word = piece.decode("utf-8", errors="replace")
                if hit and word and word not in words:
                    words.append(word)
                piece, hit = bytearray(), False
        return words

    def token_string(self, token_id: int, *, keep_space: bool = False) -> str:
        """Display string of a single id."""
        if token_id == MASK_ID:
            return "[MASK] " if keep_space else "[MASK]"
        if not 0 <= token_id < VOCAB_SIZE:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{MASK_ID})")
        piece = self.bpe.decoder[token_id]
        raw = bytearray(self.bpe.byte_decoder[c] for c in piece).decode("utf-8", errors="replace")
        if raw.endswith("</w>"):
            raw = raw[: -len("</w>")] + (" " if keep_space else "")
        return raw


def build_output_vocab(captions: Iterable[str], tokenizer: CaptionTokenizer | None = None) -> torch.Tensor:
    """Sorted ids that can be prediction targets for this corpus: every BPE id in `captions` plus ``<eot>``.

    ``<eot>`` is included because the autoregressive objective predicts it; the masked objectives never
    target it (it is never masked) and the sampler never emits it inside the canvas."""
    tokenizer = tokenizer or CaptionTokenizer()
    seen: set[int] = {EOT_ID}
    n = 0
    for text in captions:
        seen.update(tokenizer.encode_text(text))
        n += 1
    if n == 0:
        raise ValueError("cannot build an output vocabulary from an empty caption corpus")
    return torch.tensor(sorted(seen), dtype=torch.long)


# -- token id tables --------------------------------------------------------------------------------------------------

def padding_mask(tokens: torch.Tensor) -> torch.Tensor:
    """(B, L) bool, True at pads: every position after the first ``<eot>``.

    Pads cannot be found by id because the pad id 0 is also the real token "!"."""
    is_eot = tokens == EOT_ID
    return (torch.cumsum(is_eot.int(), dim=1) - is_eot.int()) > 0


def corpus_input_index(ids: torch.Tensor) -> torch.Tensor:
    """(EMBED_SIZE,) token id -> embedding row for a corpus-restricted table: rows ``ids`` in order, then
    ``<sot>``, ``[MASK]``, pad; -1 for ids the model never saw."""
    n = len(ids)
    index = torch.full((EMBED_SIZE,), -1, dtype=torch.long, device=ids.device)
    index[ids] = torch.arange(n, device=ids.device)
    index[SOT_ID], index[MASK_ID], index[PAD_ID] = n, n + 1, n + 2
    return index


def select_positions(x: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """x (B, L, ...) at the positions `select` -> (n, ...): a bool mask (B, L), or the n flat positions
    ``b * L + i`` in row-major order (what ``select.flatten().nonzero()`` gives). The second form has an output
    shape known without reading the device (a bool mask must be counted first: a host-device sync on CUDA)."""
    return x[select] if select.dtype == torch.bool else x.flatten(0, 1).index_select(0, select)


def unknown_ids(index: torch.Tensor, token_ids: torch.Tensor) -> list[int]:
    """The distinct ids among `token_ids` (any shape) that the id table `index` (EMBED_SIZE,) has no row for (-1),
    ascending: the one check behind every "word not in this model's vocabulary" error (inputs, targets, scores)."""
    missing = index[token_ids] < 0
    return token_ids[missing].unique().tolist() if bool(missing.any()) else []


def lookup_rows(input_index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Embedding rows (B, L) of token ids `tokens` (B, L); ValueError naming ids outside the corpus table."""
    unknown = unknown_ids(input_index, tokens)
    if unknown:
        raise ValueError(f"token ids {unknown[:5]} are not in this model's corpus vocabulary (it was trained with "
                         "model.output_vocab='corpus'); such words cannot be represented by this model")
    return input_index[tokens]


# -- infilling prompts: captions with some words fixed and [MASK] (or _) slots for the sampler to fill --------------

SLOT = re.compile(r"\[mask\]|(?<!\S)_(?!\S)", re.IGNORECASE)  # "[MASK]" anywhere, "_" as a word of its own


def word_list(words: list[str], limit: int = 8) -> str:
    """`words` without repeats, comma separated, at most `limit` of them and how many more."""
    unique = list(dict.fromkeys(words))
    return ", ".join(unique[:limit]) + (f" and {len(unique) - limit} more" if len(unique) > limit else "")


def parse_prompt(text: str, tokenizer: CaptionTokenizer, model: object = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N,) with ``[MASK]`` at the slots, and the fixed mask (N,) bool, of a prompt string.

    With `model`, words outside a corpus-restricted model's vocabulary raise ValueError naming them.
    Raises ValueError for an empty prompt, one without a slot, or one longer than the tokenizer's context."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the prompt is empty; write a caption with [MASK] or _ where words should be filled in")
    ids: list[int] = []
    pieces = SLOT.split(text)
    for i, piece in enumerate(pieces):
        ids += tokenizer.encode_text(piece)
        if i < len(pieces) - 1:
            ids.append(MASK_ID)
    if MASK_ID not in ids:
        raise ValueError(f"the prompt {shown(text)} has no slot to fill: mark the words to generate with [MASK] or _")
    if len(ids) > tokenizer.context_length - 2:
        raise ValueError(f"the prompt has {len(ids)} tokens; the model's context holds {tokenizer.context_length - 2}")
    prompt = torch.tensor(ids, dtype=torch.long)
    fixed = prompt != MASK_ID
    if model is not None and getattr(model, "restricted", False):
        unknown = tokenizer.words_with(prompt, {int(t) for t in prompt[fixed] if int(model.output_index[t]) < 0})
        if unknown:
            raise ValueError(f"the prompt uses words this model never saw in training: {word_list(unknown)}")
    return prompt, fixed
