"""Captioning metrics (BLEU@1-4, METEOR, ROUGE-L, CIDEr, SPICE) computed by pycocoevalcap.

This follows ``pycocoevalcap.eval.COCOEvalCap``: every caption is PTB-tokenized (lower-cased, punctuation
removed) by Stanford's tokenizer, then the scorers run on the tokenized text. Values are pycocoevalcap's raw
numbers: BLEU, METEOR, ROUGE-L and SPICE in [0, 1], CIDEr (CIDEr-D style, n = 4, sigma = 6) usually in
[0, ~10]; papers often print them x100.

Three of the pieces are Java programs shipped inside pycocoevalcap: the PTB tokenizer, METEOR 1.5 and SPICE.

* No usable ``java``: captions are tokenized by :func:`simple_tokenize` instead (scores then differ slightly from
  the official ones) and METEOR is reported unavailable. The same tokenizer is used if the PTB tokenizer fails.
* SPICE needs the Stanford CoreNLP 3.6.0 jars in ``pycocoevalcap/spice/lib``; when they are absent
  pycocoevalcap would download them from nlp.stanford.edu, so SPICE is reported unavailable instead of trying.
  A SPICE (or METEOR) failure never sinks the other metrics.

An unavailable metric has the value ``None`` and its reason under ``result["unavailable"][name]``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import shutil
import subprocess
import threading
import types
import unittest.mock
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor import meteor as _meteor_module
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.spice import spice as _spice_module
from pycocoevalcap.spice.spice import Spice
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

Captions = dict[Hashable, list[str]]  # image key -> tokenized captions (one for a prediction)
ALL_METRICS: tuple[str, ...] = ("BLEU", "METEOR", "ROUGE-L", "CIDEr", "SPICE")
_NEEDS_JAVA = {"METEOR", "SPICE"}
_SPICE_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
_TOKEN = re.compile(r"'?[^\W_]+")  # a run of letters/digits, optionally with its leading apostrophe ('s, 're)


def score_captions(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    metrics: Collection[str] = ALL_METRICS,
    per_image_cider: bool = False,
    per_image: Collection[str] = (),
) -> dict[str, Any]:
    """Score one predicted caption per image against its reference captions.

    Args:
        predictions: image key -> predicted caption. Only these images are scored (extra references are
            ignored; CIDEr's document frequencies come from the scored images' references).
        references: image key -> non-empty list of reference captions; must cover every predicted key.
        metrics: which of ``ALL_METRICS`` to compute ("BLEU" gives BLEU@1..BLEU@4). METEOR costs ~10 s of
            Java start-up; leave it out when iterating.
        per_image_cider: also return ``result["per_image"]["CIDEr"]``: image key -> CIDEr of that image.
        per_image: metrics whose per-image scores to return the same way (``"ROUGE-L"``, ``"CIDEr"``: their means
            are the corpus scores; BLEU's and METEOR's per-image scores do not average to theirs).

    Returns:
        ``{"BLEU@1".."BLEU@4", "METEOR", "ROUGE-L", "CIDEr", "SPICE"}`` (those requested) -> float, or ``None``
        when unavailable; ``"unavailable"``: metric (or ``"PTBTokenizer"``) -> reason; ``"tokenizer"``:
        ``"ptb"`` or ``"simple"`` (then ``unavailable["PTBTokenizer"]`` says why); ``"n_images"``; and
        ``"per_image"`` when asked for.

    Raises:
        ValueError: no predictions, a predicted key without references, an empty reference list, non-string
            captions, or an unknown metric name.
    """
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    unknown = set(metrics) - set(ALL_METRICS)
    if unknown:
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; choose from {list(ALL_METRICS)}")
    _check_inputs(predictions, references)
    keys = list(predictions)
    unavailable: dict[str, str] = {}

    java_reason = _java_missing_reason()
    res, gts, tokenizer = _tokenize(keys, predictions, references, java_reason, unavailable)
    out: dict[str, Any] = {}
    wanted = set(per_image) | ({"CIDEr"} if per_image_cider else set())
    per_image_scores: dict[str, dict[Hashable, float]] = {}
    for name in ALL_METRICS:  # fixed order, so output keys are stable
        if name not in metrics:
            continue
        scores, per, reason = _score_one(name, gts, res, java_reason)
        if reason is not None:
            unavailable[name] = reason
        out.update(scores)
        if name in wanted and per is not None:
            per_image_scores[name] = {k: float(s) for k, s in zip(keys, per, strict=True)}

    out["unavailable"] = unavailable
    out["tokenizer"] = tokenizer
    out["n_images"] = len(keys)
    if wanted:
        out["per_image"] = per_image_scores
    return out


def _tokenize(keys: list[Hashable], predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]],
              java_reason: str | None, unavailable: dict[str, str]) -> tuple[Captions, Captions, str]:
    """(tokenized predictions, tokenized references, "ptb" or "simple"): pycocoevalcap's PTB tokenizer when Java
    runs, else :func:`simple_tokenize` (the reason goes into `unavailable["PTBTokenizer"]`)."""
    if java_reason is None:
        try:
            res, gts = _ptb_tokenize(keys, predictions, references)
            return res, gts, "ptb"
        except Exception as err:  # e.g. a read-only site-packages (the wrapper writes a temp file there)
            unavailable["PTBTokenizer"] = f"the PTB tokenizer failed: {type(err).__name__}: {err}"
    else:
        unavailable["PTBTokenizer"] = java_reason
    res = {k: [" ".join(simple_tokenize(predictions[k]))] for k in keys}
    gts = {k: [" ".join(simple_tokenize(c)) for c in references[k]] for k in keys}
    return res, gts, "simple"


def _score_one(name: str, gts: Captions, res: Captions, java_reason: str | None
               ) -> tuple[dict[str, float | None], Any, str | None]:
    """(scores, per-image scores or None, why the metric is unavailable or None) of metric `name`. A Java metric
    that cannot run or fails is unavailable; a pure-Python scorer failing is a bug and raises."""
    if name in _NEEDS_JAVA and java_reason is not None:
        reason = f"needs Java: {java_reason}"
    elif name == "SPICE":
        reason = _spice_missing_reason()
    else:
        reason = None
    if reason is None:
        try:
            scores, per = _SCORERS[name](gts, res)
            return scores, per, None
        except Exception as err:
            if name not in _NEEDS_JAVA:
                raise
            reason = f"{name} failed: {type(err).__name__}: {err}"
    return {name: None}, None, reason


def simple_tokenize(text: str) -> list[str]:
    """Fallback tokenizer used when Java is missing; approximates pycocoevalcap's PTB tokenization.

    Lower-cases, keeps runs of letters and digits (a leading apostrophe stays attached, so "dog's" -> ["dog",
    "'s"] as PTB does) and drops all other punctuation. Differences from PTB: "don't" -> ["don", "'t"] (PTB:
    "do", "n't"), hyphenated words are split. Example: "A dog's red ball." -> ["a", "dog", "'s", "red", "ball"].
    """
    return _TOKEN.findall(text.lower())


def _ptb_tokenize(keys: list[Hashable], predictions: Mapping[Hashable, str],
                  references: Mapping[Hashable, Sequence[str]]) -> tuple[Captions, Captions]:
    """PTB-tokenize predictions and references in one Java call; returns (res, gts) keyed like ``keys``.

    Whitespace runs (\\r, \\u2028 ... included) become one space first: the wrapper pairs captions with output
    lines, so a stray line break would silently shift every later caption onto the wrong image.
    """
    batch = {("res", i): [{"caption": " ".join(predictions[k].split())}] for i, k in enumerate(keys)}
    batch.update({("gts", i): [{"caption": " ".join(c.split())} for c in references[k]] for i, k in enumerate(keys)})
    with _quiet_java():
        tok = PTBTokenizer().tokenize(batch)
    res = {k: tok.get(("res", i), []) for i, k in enumerate(keys)}
    gts = {k: tok.get(("gts", i), []) for i, k in enumerate(keys)}
    for k in keys:  # the wrapper zips ids with output lines, which would hide a short output
        if len(res[k]) != 1 or len(gts[k]) != len(references[k]):
            raise RuntimeError(f"PTB tokenizer lost captions for image {k!r}")
    return res, gts


@contextlib.contextmanager
def _quiet_java() -> Iterator[None]:
    """Inside the block, the Java program pycocoevalcap's tokenizer starts writes nothing to this process's stderr
    (it prints "PTBTokenizer tokenized N tokens at ..." on every call: a red box in a notebook that reads as an
    error). Only the tokenizer module's view of ``subprocess.Popen`` changes."""
    from pycocoevalcap.tokenizer import ptbtokenizer

    quiet = types.SimpleNamespace(PIPE=subprocess.PIPE,
                                  Popen=functools.partial(subprocess.Popen, stderr=subprocess.DEVNULL))
    with unittest.mock.patch.object(ptbtokenizer, "subprocess", quiet):
        yield


def _bleu(gts: Captions, res: Captions) -> tuple[dict[str, float], list[float]]:
    score, per = Bleu(4).compute_score(gts, res, verbose=0)  # score: [BLEU-1, ..., BLEU-4], corpus-level
    return {f"BLEU@{n + 1}": float(s) for n, s in enumerate(score)}, per[3]


class MeteorProcess:
    """METEOR 1.5 (the jar pycocoevalcap ships) as one Java process, spoken to the way ``pycocoevalcap``'s
    ``Meteor`` does (a ``SCORE`` line per image, then one ``EVAL`` line), without its two ways to hang: its stderr
    pipe is never read (a chatty JVM fills it and both sides wait forever), and an error while it holds its lock
    makes the later ``__del__`` wait on that lock forever. Here stderr is discarded, every answer is awaited at
    most `timeout` seconds, and a process that dies or stops answering is killed and named in a RuntimeError
    (which :func:`score_captions` reports as METEOR unavailable, never sinking the other metrics)."""

    def __init__(self, timeout: float = 300.0):
        self.timeout = timeout
        self.proc = subprocess.Popen(
            ["java", "-jar", "-Xmx2G", _meteor_module.METEOR_JAR, "-", "-", "-stdio", "-l", "en", "-norm"],
            cwd=os.path.dirname(os.path.abspath(_meteor_module.__file__)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._lines: queue.Queue[str | None] = queue.Queue()  # a reader thread, so an answer can time out
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stdout: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in stdout:
                self._lines.put(raw.decode().strip())
        self._lines.put(None)  # end of output: the process is gone

    def _ask(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()
        except OSError as err:  # BrokenPipeError: the process is gone
            self.close()
            raise RuntimeError(f"METEOR's Java process ended (java -jar {_meteor_module.METEOR_JAR}): {err}") from None

    def _answer(self) -> str:
        try:
            text = self._lines.get(timeout=self.timeout)
        except queue.Empty:
            text, why = None, f"gave no answer in {self.timeout:.0f} s"
        else:
            why = "ended"
        if not text:
            self.close()
            raise RuntimeError(f"METEOR's Java process {why} (java -jar {_meteor_module.METEOR_JAR})")
        return text

    def compute_score(self, gts: Captions, res: Captions) -> tuple[float, list[float]]:
        """Corpus METEOR and the per-image scores, in `res`'s key order (as pycocoevalcap's ``Meteor``)."""
        stats = []
        for key in res:
            hypothesis = res[key][0].replace("|||", "").replace("  ", " ")
            self._ask(" ||| ".join(("SCORE", " ||| ".join(gts[key]), hypothesis)))
            stats.append(self._answer())
        self._ask("EVAL ||| " + " ||| ".join(stats))
        per = [float(self._answer()) for _ in stats]
        return float(self._answer()), per

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _meteor(gts: Captions, res: Captions) -> tuple[dict[str, float], list[float]]:
    if MeteorSession.active:  # one Java process for every score of the block
        if MeteorSession.active[-1] is None:
            MeteorSession.active[-1] = MeteorProcess()
        try:
            score, per = MeteorSession.active[-1].compute_score(gts, res)
        except RuntimeError:
            MeteorSession.active[-1] = None  # the next score starts a new process
            raise
        return {"METEOR": float(score)}, per
    scorer = MeteorProcess()  # starts `java -jar meteor-1.5.jar` (~10 s to load its paraphrase table)
    try:
        score, per = scorer.compute_score(gts, res)
    finally:
        scorer.close()
    return {"METEOR": float(score)}, per


class MeteorSession:
    """``with MeteorSession(): ...``: every METEOR score inside the block reuses one METEOR Java process, started
    on first use (each start costs ~10 s), e.g. to score several decoders' captions in a row. Each score is
    computed on its own (METEOR's corpus score comes from one ``EVAL`` call per set of captions)."""

    active: list[Any] = []  # a stack: None until the block's first METEOR score starts the process

    def __enter__(self) -> MeteorSession:
        MeteorSession.active.append(None)
        return self

    def __exit__(self, *exc: object) -> None:
        scorer = MeteorSession.active.pop()
        if scorer is not None:
            scorer.close()


def _rouge(gts: Captions, res: Captions) -> tuple[dict[str, float], list[float]]:
    score, per = Rouge().compute_score(gts, res)
    return {"ROUGE-L": float(score)}, list(per)


def _cider(gts: Captions, res: Captions) -> tuple[dict[str, float], list[float]]:
    score, per = Cider().compute_score(gts, res)
    return {"CIDEr": float(score)}, list(per)


def _spice(gts: Captions, res: Captions) -> tuple[dict[str, float], list[float]]:
    score, per = Spice().compute_score(gts, res)
    return {"SPICE": float(score)}, [p["All"]["f"] for p in per]


# metric name -> scorer(gts, res) -> ({output key: corpus score}, per-image scores in key order)
_SCORERS: dict[str, Callable[[Captions, Captions], tuple[dict[str, float], list[float]]]] = {
    "BLEU": _bleu, "METEOR": _meteor, "ROUGE-L": _rouge, "CIDEr": _cider, "SPICE": _spice,
}


@functools.lru_cache(maxsize=1)
def _java_missing_reason() -> str | None:
    """None when a working ``java`` is on PATH, else why not (checked once per process, 30 s at most)."""
    java = shutil.which("java")
    if java is None:
        return "no `java` executable on PATH (pycocoevalcap's PTB tokenizer, METEOR and SPICE are Java programs)"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        return f"`java -version` failed: {type(err).__name__}: {err}"
    return None


def _spice_missing_reason() -> str | None:
    """None when SPICE can run offline (its Stanford CoreNLP jars are present), else why not. No network."""
    lib = Path(_spice_module.__file__).parent / "lib"
    missing = [jar for jar in _SPICE_JARS if not (lib / jar).exists()]
    if missing:
        return (f"SPICE needs {', '.join(missing)} in {lib}; pycocoevalcap would download them from "
                "nlp.stanford.edu, which is not attempted (no network). Copy the jars there to enable SPICE.")
    return None


def _check_inputs(predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]) -> None:
    if not predictions:
        raise ValueError("predictions is empty: nothing to score")
    missing = [k for k in predictions if k not in references]
    if missing:
        raise ValueError(f"{len(missing)} predicted key(s) have no references, e.g. {missing[:5]}")
    for k, caption in predictions.items():
        if not isinstance(caption, str):
            raise ValueError(f"prediction for {k!r} must be a str, got {type(caption).__name__}")
        refs = references[k]
        if isinstance(refs, str) or not isinstance(refs, Sequence):
            raise ValueError(f"references[{k!r}] must be a list of strings, got {type(refs).__name__}")
        if len(refs) == 0:
            raise ValueError(f"references[{k!r}] is an empty list; every scored image needs a reference")
        if not all(isinstance(r, str) for r in refs):
            raise ValueError(f"references[{k!r}] must contain only strings")
