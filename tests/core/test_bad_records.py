"""Issue 59 items 6 and 7: a caption the tokenizer cannot use (only control characters, a word of 16k letters) is
skipped and counted by training, never the end (or a stall) of a run; the tokenizer bounds a caption's and a word's
length before BPE, whose cost grows with the square of a word's length, and echoes at most 40 characters."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from mdc_core import tokenizer as tok
from mdc_core.tokenizer import MAX_CAPTION_CHARS, MAX_WORD_CHARS, CaptionTokenizer, CaptionTooLong
from mdc_workbench.cli import main
from tests.workbench.test_cli import MICRO_SETS

HUGE_WORD = "a" * 16_000


def _set_caption(shard: Path, index: int, caption: bytes) -> None:
    """Rewrite the caption of record `index` of `shard`."""
    with tarfile.open(shard) as tar:
        members = [(info, tar.extractfile(info).read() if info.isfile() else None) for info in tar.getmembers()]
    texts = [i for i, (info, _) in enumerate(members) if info.name.endswith(".txt")]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i, (info, payload) in enumerate(members):
            if i == texts[index]:
                payload = caption
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    shard.write_bytes(buffer.getvalue())


@pytest.fixture
def counting_bpe(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every word CLIP's BPE is asked to merge."""
    bpe = tok._bpe()
    lengths: list[int] = []
    original = bpe.bpe
    monkeypatch.setattr(bpe, "bpe", lambda token: lengths.append(len(token)) or original(token))
    return lengths


@pytest.mark.parametrize("text", [HUGE_WORD, "a red " + HUGE_WORD, "!" * 16_000, "red " * (MAX_CAPTION_CHARS // 3)])
def test_the_tokenizer_bounds_a_caption_and_a_word_before_bpe(text: str, counting_bpe: list[int]) -> None:
    """Issue 59 item 6: a word of 16k letters (or of punctuation), or a caption past the bound, is refused before
    BPE merges anything, and the message echoes at most 40 characters of it."""
    for call in (lambda: CaptionTokenizer()(text), lambda: CaptionTokenizer().encode_text(text)):
        with pytest.raises(CaptionTooLong) as err:
            call()
        assert len(str(err.value)) < 250 and "characters" in str(err.value)
    assert counting_bpe == []
    fine = "a " + "b" * MAX_WORD_CHARS  # at the bound: tokenized
    assert CaptionTokenizer()(fine).shape == (1, 77) and max(counting_bpe) <= MAX_WORD_CHARS + 1


@pytest.mark.parametrize("caption, reason", [(b"\x00\x01\x02", "empty_caption"),
                                              (HUGE_WORD.encode(), "caption_too_long")])
def test_a_caption_the_tokenizer_cannot_use_is_skipped_and_counted(tmp_path: Path, caption: bytes,
                                                                   reason: str) -> None:
    """Issue 59 item 7: a shard caption `\\x00\\x01\\x02` (empty after tokenization) or one word of 16k letters: the
    run trains to its end and `epochs.jsonl` counts the record, by reason, in every epoch."""
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "16", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    _set_caption(sorted((data / "train").glob("*.tar"))[0], 3, caption)
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "4", "--quiet",
                 *MICRO_SETS]) == 0
    epochs = [json.loads(line) for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert epochs and all(e["skipped"] == {reason: 1} for e in epochs)
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
